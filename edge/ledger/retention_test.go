package ledger

import (
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestRemoveSettled: only segments that are not stored and whose records
// are all Acked at or before the cutoff lose their records, all of them,
// in one go; the pending index stays consistent (checked at cleanup).
func TestRemoveSettled(t *testing.T) {
	f := newLedger(t, nil)
	ack := func(seg, peer string, at time.Time) {
		t.Helper()
		must[[]string](t)(f.l.EnsureScheduled(seg, []string{peer}, at))
		if _, ok, err := f.l.TryTransitionInflight(seg, peer, at); err != nil || !ok {
			t.Fatalf("claim %s/%s: %v", seg, peer, err)
		}
		must[Record](t)(f.l.TransitionAcked(seg, peer, at))
	}
	old, recent := t0, t0.Add(time.Hour)
	cutoff := t0.Add(time.Minute)
	ack("gone", "b", old) // removed: gone, all acked long ago
	ack("gone", "c", old)
	ack("gone-recent", "b", old) // kept: one ack is newer than the cutoff
	ack("gone-recent", "c", recent)
	ack("stored", "b", old) // kept: still stored
	ack("dead", "b", old)   // kept: a deadletter is the operator's to purge
	must[[]string](t)(f.l.EnsureScheduled("dead", []string{"c"}, old))
	f.l.TryTransitionInflight("dead", "c", old)
	must[Record](t)(f.l.TransitionFailed("dead", "c", errors.New("x"), old, Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}))
	ack("pending", "b", old) // kept: work left
	must[[]string](t)(f.l.EnsureScheduled("pending", []string{"c"}, old))
	ack("ga", "b", old) // removed: a segment id that prefixes nothing else
	stored := func(_ *bolt.Tx, seg string) bool { return seg == "stored" }

	segs, recs, err := f.l.RemoveSettled(cutoff, stored)
	if err != nil || segs != 2 || recs != 3 {
		t.Fatalf("RemoveSettled = %d segments, %d records, %v; want 2, 3", segs, recs, err)
	}
	for _, seg := range []string{"gone", "ga"} {
		if rs := must[[]Record](t)(f.l.ListBySegment(seg)); len(rs) != 0 {
			t.Errorf("%s kept %+v", seg, rs)
		}
	}
	for seg, n := range map[string]int{"gone-recent": 2, "stored": 1, "dead": 2, "pending": 2} {
		if rs := must[[]Record](t)(f.l.ListBySegment(seg)); len(rs) != n {
			t.Errorf("%s: %d records left, want %d", seg, len(rs), n)
		}
	}
	// The operator purges the deadletter: now "dead" is settled too.
	if n := len(must[[]Record](t)(f.l.Purge("dead", "c"))); n != 1 {
		t.Fatal("purge")
	}
	segs, recs, err = f.l.RemoveSettled(cutoff, stored)
	if err != nil || segs != 1 || recs != 1 {
		t.Fatalf("after purge: %d segments, %d records, %v; want the rest of dead", segs, recs, err)
	}
	// Idempotent.
	if segs, recs, err = f.l.RemoveSettled(cutoff, stored); err != nil || segs+recs != 0 {
		t.Fatalf("second run removed %d/%d, %v", segs, recs, err)
	}
}
