package ledger

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestPriorityOrderIsStable: the order in which owed work is handed out
// (Pending: next attempt time, then segment id, then peer id) is a
// function of the records alone. The same records created in opposite
// orders, one set also reopened from disk, come out in the same order,
// every time, and ties at one time go by segment id, then peer id.
func TestPriorityOrderIsStable(t *testing.T) {
	type owed struct {
		seg   string
		peers []string
		at    time.Duration
	}
	work := []owed{
		{"seg-9", []string{"c", "b"}, 0}, {"seg-10", []string{"b"}, 0}, {"seg-1", []string{"b", "c"}, time.Second},
		{"a", []string{"c"}, 0}, {"seg-2", []string{"c", "b", "a"}, -time.Second}, {"z", []string{"b"}, time.Second},
	}
	build := func(order []owed) *fixture {
		f := newLedger(t, &bolt.Options{NoSync: true})
		for _, w := range order {
			must[[]string](t)(f.l.EnsureScheduled(w.seg, w.peers, t0.Add(w.at)))
		}
		// A failed attempt re-enters at its back-off time (t0 + 1 s, tied
		// with seg-1 and ahead of it by id), behind work due earlier:
		// retries do not jump the queue.
		claimOK(t, f.l, "a", "c", t0)
		must[Record](t)(f.l.TransitionFailed("a", "c", errors.New("e"), t0, testPolicy))
		return f
	}
	reversed := slices.Clone(work)
	slices.Reverse(reversed)
	one, two := build(work), build(reversed)
	// Reopen a copy of two's file.
	path := filepath.Join(t.TempDir(), "copy.db")
	must0(t, two.db.View(func(tx *bolt.Tx) error { return tx.CopyFile(path, 0o600) }))
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	reopened := &fixture{db: db}
	if reopened.l, err = Open(db); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	want := "seg-2/a seg-2/b seg-2/c seg-10/b seg-9/b seg-9/c a/c seg-1/b seg-1/c z/b "
	for i := range 3 {
		for name, f := range map[string]*fixture{"forward": one, "reversed": two, "reversed and reopened": reopened} {
			if got := keys(must[[]Record](t)(f.l.Pending(now, 0))); got != want {
				t.Fatalf("run %d, %s: order\n %s\nwant\n %s", i, name, got, want)
			}
		}
	}
}

// TestCheckRecords: the start-up check of the database finds a pending
// record missing from the pending index, and a pending key without a
// record.
func TestCheckRecords(t *testing.T) {
	f := newLedger(t, &bolt.Options{NoSync: true})
	must[[]string](t)(f.l.EnsureScheduled("s", []string{"b"}, t0))
	check := func() error {
		return f.db.View(func(tx *bolt.Tx) error { return CheckRecords(tx) })
	}
	must0(t, check())
	edit := func(fn func(b buckets) error) {
		t.Helper()
		must0(t, f.db.Update(func(tx *bolt.Tx) error {
			b, err := bucketsOf(tx)
			if err != nil {
				return err
			}
			return fn(b)
		}))
	}
	edit(func(b buckets) error { return b.pending.Delete(pendKey(t0, "s", "b")) })
	if err := check(); err == nil {
		t.Fatal("a scheduled record missing from the pending index passed")
	}
	edit(func(b buckets) error {
		if err := b.pending.Put(pendKey(t0, "s", "b"), nil); err != nil {
			return err
		}
		return b.pending.Put(pendKey(t0, "gone", "b"), nil)
	})
	if err := check(); err == nil {
		t.Fatal("a pending key without a record passed")
	}
	edit(func(b buckets) error { return b.pending.Delete(pendKey(t0, "gone", "b")) })
	must0(t, check())
}

func must0(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
