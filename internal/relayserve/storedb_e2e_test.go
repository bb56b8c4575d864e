package relayserve_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
)

// `relay serve --check-config` on a database store connects and checks
// it: ok on a database this release can run on (a new one: nothing is
// created), and exit 1 with the reason on one migrated by a newer
// release, writing nothing either way.
func TestCheckConfigCLIOnPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cfgPath := servetest.WriteConfig(t, fmt.Sprintf("listen: 127.0.0.1:0\nauth: {anonymous: {read: true}}\nstore: %s\n", fmt.Sprintf("{type: postgres, postgres: {dsn: %q}}", dsn)))
	out, err := exec.Command(relayBin, "serve", "--check-config", "--config", cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), cfgPath+": ok") {
		t.Fatalf("--check-config on a new database: %v\n%s", err, out)
	}
	admin := pgtest.Pool(t, dsn, 1)
	var tables int
	if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_class WHERE relname LIKE 'relay_%'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("--check-config created %d relations (%v)", tables, err)
	}
	for _, stmt := range []string{
		`CREATE TABLE relay_schema (version integer PRIMARY KEY, description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO relay_schema (version, description) VALUES (1, 'one'), (7, 'from the future')`,
	} {
		if _, err := admin.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	out, err = exec.Command(relayBin, "serve", "--check-config", "--config", cfgPath).CombinedOutput()
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "the database has schema version 7, this release knows up to 1") {
		t.Fatalf("--check-config on a newer schema: %v\n%s", err, out)
	}
}
