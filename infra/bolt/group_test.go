package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// waitFor yields until cond holds (in-process goroutines reaching a
// state; there is nothing to block on).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 10_000_000 {
			t.Fatalf("never: %s", what)
		}
		runtime.Gosched()
	}
}

func (c *committer) state() (commits, queued int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commits, len(c.queue)
}

// holdWriter takes bbolt's writer lock, so the next commit waits behind
// it; release lets it go.
func holdWriter(t *testing.T, db *DB) (release func()) {
	t.Helper()
	tx, err := db.bolt.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release) // before the deferred Close of a failed test
	return release
}

func put(k, v string) relaycore.Batch {
	return relaycore.Batch{Writes: []relaycore.Write{{Key: k, Value: []byte(v)}}}
}

// TestGroupCommit: Applys that arrive while a commit waits or runs are
// committed together in the next transaction, in arrival order, and each
// keeps its own outcome: a false precondition or a cancelled context fails
// that batch alone, writing nothing, while the others commit.
func TestGroupCommit(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "g.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := db.Store("t")
	ctx := t.Context()
	if err := st.Apply(ctx, "p", put("guard", "v1")); err != nil {
		t.Fatal(err)
	}
	base, _ := db.gc.state()

	release := holdWriter(t, db)
	leader := make(chan error, 1)
	go func() { leader <- st.Apply(ctx, "p", put("first", "x")) }()
	waitFor(t, "the leader takes its group", func() bool { c, _ := db.gc.state(); return c == base+1 })

	// Cancelled after it is queued: Apply checks the context before
	// queueing too.
	cancelled, cancel := context.WithCancel(ctx)
	type call struct {
		ctx  context.Context
		b    relaycore.Batch
		want string // "" ok, "cond", "ctx"
	}
	calls := []call{
		{ctx, put("a", "1"), ""},
		{ctx, relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "guard", Value: []byte("v0")}}, Writes: []relaycore.Write{{Key: "stale", Value: []byte("x")}}}, "cond"},
		{cancelled, put("gone", "x"), "ctx"},
		{ctx, relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "a", Value: []byte("1")}}, Writes: []relaycore.Write{{Key: "b", Value: []byte("after a")}}}, ""},
		{ctx, put("c", "3"), ""},
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = st.Apply(c.ctx, "p", c.b) }()
		// One at a time, so arrival order is the slice's (b reads a's write).
		waitFor(t, fmt.Sprintf("call %d queued", i), func() bool { _, q := db.gc.state(); return q == i+1 })
	}
	cancel()
	release()
	wg.Wait()
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	if c, _ := db.gc.state(); c != base+2 {
		t.Errorf("%d transactions for the leader and %d queued batches, want 2", c-base, len(calls))
	}
	for i, c := range calls {
		var cf *relaycore.ConditionFailedError
		switch {
		case c.want == "" && errs[i] != nil,
			c.want == "cond" && !errors.As(errs[i], &cf),
			c.want == "ctx" && !errors.Is(errs[i], context.Canceled):
			t.Errorf("call %d: %v, want %q", i, errs[i], c.want)
		}
	}
	for k, want := range map[string]string{"first": "x", "a": "1", "b": "after a", "c": "3", "stale": "", "gone": ""} {
		v, ok, err := st.Get(ctx, "p", k)
		if err != nil || string(v) != want || ok != (want != "") {
			t.Errorf("%s = %q %v (%v), want %q", k, v, ok, err, want)
		}
	}
	if err := db.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestGroupCommitIsolatesFailure: a batch that fails inside the
// transaction for a reason other than a precondition (here a table whose
// layout is broken) rolls its group back, and every batch is retried
// alone: the others commit, the broken one fails.
func TestGroupCommitIsolatesFailure(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "g.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := t.Context()
	// "part" must be a bucket inside a table bucket; a plain key there
	// makes every write to the table fail inside the transaction.
	tx, err := db.bolt.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := tx.CreateBucket([]byte("broken"))
	if err == nil {
		err = tb.Put(partsBucket, []byte("not a bucket"))
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	base, _ := db.gc.state()
	release := holdWriter(t, db)
	leader := make(chan error, 1)
	go func() { leader <- db.Store("t").Apply(ctx, "p", put("first", "x")) }()
	waitFor(t, "the leader takes its group", func() bool { c, _ := db.gc.state(); return c == base+1 })
	stores := []*Store{db.Store("t"), db.Store("broken"), db.Store("t")}
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Apply(ctx, "p", put(fmt.Sprint("k", i), "v")) }()
		waitFor(t, fmt.Sprintf("call %d queued", i), func() bool { _, q := db.gc.state(); return q == i+1 })
	}
	release()
	wg.Wait()
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[2] != nil || errs[1] == nil {
		t.Fatalf("errors %v, want only the broken table's", errs)
	}
	for _, k := range []string{"k0", "k2"} {
		if _, ok, err := db.Store("t").Get(ctx, "p", k); !ok || err != nil {
			t.Errorf("%s not committed (%v)", k, err)
		}
	}
}
