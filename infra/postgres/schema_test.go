package postgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

// tables lists the relations of the database's public schema, for
// "nothing was written" checks.
func tables(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var names string
	err := pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(relname, ',' ORDER BY relname), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`).Scan(&names)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestMigrateCreatesAndRecords(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.NewDatabase(t), 2)
	if got := tables(t, pool); got != "" {
		t.Fatalf("fresh database has %q", got)
	}
	for range 2 { // the second Open finds the schema current and writes nothing
		if _, err := postgres.Open(t.Context(), pool, postgres.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := tables(t, pool), "relay_items,relay_items_due,relay_items_pkey,relay_schema,relay_schema_pkey"; got != want {
		t.Fatalf("tables = %q, want %q", got, want)
	}
	var n, v int
	if err := pool.QueryRow(t.Context(), `SELECT count(*), max(version) FROM relay_schema`).Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	if n != 1 || v != postgres.SchemaVersion {
		t.Fatalf("relay_schema has %d rows up to version %d, want 1 row of version %d", n, v, postgres.SchemaVersion)
	}
}

// TestConcurrentOpens: replicas starting together migrate once.
func TestConcurrentOpens(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.NewDatabase(t), 4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := postgres.Open(t.Context(), pool, postgres.Options{})
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM relay_schema`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != postgres.SchemaVersion {
		t.Fatalf("relay_schema has %d rows, want %d", n, postgres.SchemaVersion)
	}
}

// TestConcurrentStartsAfterVerify: replicas starting together, each
// checking its privileges first (relay serve runs Verify, then Open, on
// one connection), all start. Verify's lookup of relay_schema left the
// waiting replicas' sessions believing it absent after the first one
// created it (the catalog cache is refreshed at a transaction's start,
// not by the advisory lock), and they failed "relation relay_schema
// already exists".
func TestConcurrentStartsAfterVerify(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const replicas = 4
	pools := make([]*pgxpool.Pool, replicas)
	for i := range pools {
		pools[i] = pgtest.Pool(t, dsn, 1)
		if err := postgres.Verify(t.Context(), pools[i]); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, replicas)
	for _, pool := range pools {
		go func() {
			_, err := postgres.Open(t.Context(), pool, postgres.Options{})
			errs <- err
		}()
	}
	for range replicas {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSchemaTooNewRefused: a database migrated by a newer release is
// refused with a clear error, and nothing is written: here the newer
// release left only its relay_schema row, so a relay that wrote anything
// would have created relay_items.
func TestSchemaTooNewRefused(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.NewDatabase(t), 2)
	ctx := t.Context()
	for _, sql := range []string{
		`CREATE TABLE relay_schema (version integer PRIMARY KEY, description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO relay_schema (version, description) VALUES (1, 'one'), (99, 'from the future')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	before := tables(t, pool)
	_, err := postgres.Open(ctx, pool, postgres.Options{})
	if !errors.Is(err, postgres.ErrSchemaTooNew) {
		t.Fatalf("open = %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("error %q does not name the database's version", err)
	}
	if after := tables(t, pool); after != before {
		t.Fatalf("refused open changed the tables: %q -> %q", before, after)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_schema`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("relay_schema rows = %d, %v; want the 2 untouched", n, err)
	}
}

// TestNoPermission: a role that may not create tables gets an error that
// says what it lacks, and nothing is written.
func TestNoPermission(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pgtest.Admin(t, `DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'weak') THEN CREATE ROLE weak LOGIN; END IF; END $$`)
	owner := pgtest.Pool(t, dsn, 1)
	pool := pgtest.Pool(t, strings.Replace(dsn, "user=relay", "user=weak", 1), 1)
	_, err := postgres.Open(t.Context(), pool, postgres.Options{})
	if err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), "needs CREATE") {
		t.Fatalf("open as a role without CREATE = %v; want permission denied, with what the role needs", err)
	}
	if got := tables(t, owner); got != "" {
		t.Fatalf("refused open left %q", got)
	}
}
