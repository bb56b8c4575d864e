package postgres

import (
	"context"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// TestCancelledLockWait: an Apply waiting for a key another transaction
// holds, whose context ends, fails. With pgx's default context handling
// (a deadline on the socket, no cancel request) the server keeps waiting
// and may commit the batch once the holder lets go, after Apply returned:
// so the error must be "maybe applied", and it is. Only if it said
// "surely not applied" (a pool whose handler sends the server a cancel
// request, answered in time) must nothing land.
func TestCancelledLockWait(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn, 4)
	ctx := t.Context()
	db, err := Open(ctx, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Store("wait")
	b := relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}}

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, lockSQL, lockKeys(s.name, "p", b)); err != nil {
		t.Fatal(err)
	}

	applyCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Apply(applyCtx, "p", b) }()
	// Wait until the Apply's backend waits on the advisory lock (the
	// server's own view, so no timing is assumed).
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("apply returned %v while the lock was held", err)
		default:
		}
	}
	cancel()
	err = <-done
	if err == nil {
		t.Fatal("apply whose context ended during the lock wait succeeded")
	}
	t.Logf("apply: %v (maybe applied: %v)", err, relaycore.MayBeApplied(err))
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if relaycore.MayBeApplied(err) {
		return
	}
	// Surely not applied: the server's statement was cancelled. A batch
	// guarding the key's absence would wait for the first's lock if it
	// were still alive, and fail if it had landed.
	guard := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: "k", Absent: true}},
		Writes:        []relaycore.Write{{Key: "other", Value: []byte("x")}},
	}
	if err := s.Apply(ctx, "p", guard); err != nil {
		t.Fatalf("after a surely-not-applied apply, its key is not absent: %v", err)
	}
}
