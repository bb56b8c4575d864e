package relayserve

import (
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

// TLS to PostgreSQL for real (pgtest.TLS: ssl=on, a server certificate of
// the cluster's own CA): relay serve with sslmode=verify-full and the
// right CA as sslrootcert connects over TLS (the server's pg_stat_ssl says
// so for its connections) and delivers; with another CA it refuses at
// start and --check-config refuses too, saying the certificate is not
// trusted, and nothing is written.
func TestPostgresTLS(t *testing.T) {
	c := pgtest.TLS(t)
	unix := c.NewDatabase(t)
	db := strings.TrimPrefix(unix[strings.Index(unix, "dbname="):], "dbname=")
	db = strings.Fields(db)[0]
	admin := pgtest.Pool(t, unix, 1)
	relayTables := func() string {
		var names string
		if err := admin.QueryRow(t.Context(), `SELECT coalesce(string_agg(relname, ',' ORDER BY relname), '') FROM pg_class WHERE relname LIKE 'relay_%' AND relkind = 'r'`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}

	wrong, err := pgtest.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ name, dsn, want string }{
		{"another CA", c.TCPDSN(db, wrong), "tls: failed to verify certificate: x509: certificate signed by unknown authority"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			start, check := startRefused(t, dbConfig(t, pgStore(bad.dsn)))
			for _, err := range []error{start, check} {
				if !strings.Contains(err.Error(), "store.postgres") || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("error %v: want store.postgres and %q", err, bad.want)
				}
			}
			if got := relayTables(); got != "" {
				t.Fatalf("tables written through a refused server: %s", got)
			}
		})
	}

	cfg := dbConfig(t, pgStore(c.TCPDSN(db, c.CAFile())))
	if _, err := CheckStore(t.Context(), cfg); err != nil {
		t.Fatalf("check-config with the right CA: %v", err)
	}
	cancel, done, url, _ := runServer(t, cfg, nil)
	enqueueOne(t, url)
	waitWatermark(t, url, "t1")
	var plain, encrypted int
	if err := admin.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'relay serve'`).Scan(&plain, &encrypted); err != nil {
		t.Fatal(err)
	}
	if plain != 0 || encrypted == 0 {
		t.Fatalf("relay serve's connections: %d in clear, %d over TLS; want all over TLS", plain, encrypted)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
