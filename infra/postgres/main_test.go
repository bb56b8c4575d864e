package postgres_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

// TestMain starts one throwaway cluster for the package's tests (on first
// use) and stops it at the end, also when a test fails.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// storeSeq names the stores a test run makes on the shared database, so
// each conformance subtest starts with an empty store without creating a
// database of its own.
var storeSeq atomic.Int64

// sharedDB opens the relay schema on the test binary's shared database.
func sharedDB(t testing.TB) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(t.Context(), pgtest.SharedDatabase(t), postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// freshStore is a store no other test uses, whose items are deleted when t
// ends.
func freshStore(t testing.TB, db *postgres.DB) *postgres.Store {
	t.Helper()
	s := db.Store(fmt.Sprintf("t%d", storeSeq.Add(1)))
	t.Cleanup(func() {
		pool := pgtest.SharedDatabase(t)
		if _, err := pool.Exec(context.Background(), `DELETE FROM relay_items WHERE store = $1`, s.Name()); err != nil {
			t.Errorf("delete the items of store %s: %v", s.Name(), err)
		}
	})
	return s
}
