package pgtest_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// BackendCPU counts the sessions on its database, and only them: a query
// that keeps a backend busy for a while shows on its database and not on
// another's.
func TestBackendCPU(t *testing.T) {
	busy, idle := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	name := func(dsn string) string {
		c, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c.Database
	}
	pool, other := pgtest.Pool(t, busy, 1), pgtest.Pool(t, idle, 1)
	if _, err := other.Exec(t.Context(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	c := pgtest.Get(t)
	before, err := c.BackendCPU(name(busy))
	if err != nil {
		t.Fatal(err)
	}
	// Sorting five million numbers: seconds of one backend's CPU on any
	// machine, far above /proc's 10 ms tick.
	if _, err := pool.Exec(t.Context(), "SELECT count(*) FROM (SELECT g FROM generate_series(1, 5000000) g ORDER BY random()) s"); err != nil {
		t.Fatal(err)
	}
	after, err := c.BackendCPU(name(busy))
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100*time.Millisecond {
		t.Fatalf("the busy database's sessions used %v for the sort; want at least 100ms", after-before)
	}
	if d, err := c.BackendCPU(name(idle)); err != nil || d > after-before/2 {
		t.Fatalf("the idle database's session: %v, %v; want well under the busy one's %v", d, err, after-before)
	}
}
