package ledger

import (
	"encoding/json"
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A takedown cancels every record of the segment that is not Acked, in
// whatever state, inside the caller's transaction; the cancelled records
// are terminal (never pending, never retried), stored as Deadletter with a
// flag so an older agent's start-up check accepts them, and go with
// retention like Acked ones.
func TestCancelSegment(t *testing.T) {
	f := newLedger(t, nil)
	peers := []string{"acked", "deadletter", "failed", "inflight", "scheduled"}
	if _, err := f.l.EnsureScheduled("seg", peers, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.EnsureScheduled("other", []string{"scheduled"}, t0); err != nil {
		t.Fatal(err)
	}
	claim := func(peer string) {
		t.Helper()
		if _, ok, err := f.l.TryTransitionInflight("seg", peer, t0); err != nil || !ok {
			t.Fatalf("claim %s: %v %v", peer, ok, err)
		}
	}
	for _, p := range []string{"acked", "deadletter", "failed", "inflight"} {
		claim(p)
	}
	if _, err := f.l.TransitionAcked("seg", "acked", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.TransitionFailed("seg", "failed", errors.New("x"), t0, testPolicy); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.TransitionFailed("seg", "deadletter", errors.New("x"), t0, Policy{MaxRetries: 1, Initial: 1, Max: 1}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := f.db.Update(func(tx *bolt.Tx) error {
		var err error
		n, err = f.l.CancelSegmentIn(tx, "seg", "evicted for takedown", t0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("cancelled %d records, want 4", n)
	}
	recs, _ := f.l.ListBySegment("seg")
	for _, r := range recs {
		want := StateCancelled
		if r.PeerID == "acked" {
			want = StateAcked
		}
		if r.State != want || (want == StateCancelled && r.LastError != "evicted for takedown") {
			t.Errorf("%s: %+v, want %s", r.PeerID, r, want)
		}
	}
	// The attempt that was in flight records nothing.
	if _, err := f.l.TransitionFailed("seg", "inflight", errors.New("cut"), t0, testPolicy); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("failure of a cancelled record: %v", err)
	}
	if due, _ := f.l.Pending(t0.Add(1e12), 100); len(due) != 1 || due[0].SegmentID != "other" {
		t.Fatalf("pending after cancel: %+v", due)
	}
	// On disk: state 5 (deadletter) with the flag.
	f.db.View(func(tx *bolt.Tx) error {
		b, _ := bucketsOf(tx)
		var s stored
		json.Unmarshal(b.records.Get(recKey("seg", "scheduled")), &s)
		if s.State != StateDeadletter || !s.Cancelled {
			t.Errorf("stored as %+v", s)
		}
		if err := CheckRecords(tx); err != nil {
			t.Error(err)
		}
		return nil
	})
	// Idempotent.
	f.db.Update(func(tx *bolt.Tx) error {
		n, _ = f.l.CancelSegmentIn(tx, "seg", "again", t0)
		return nil
	})
	if n != 0 {
		t.Fatalf("second cancel moved %d", n)
	}
	segs, recsGone, err := f.l.RemoveSettled(t0, func(*bolt.Tx, string) bool { return false })
	if err != nil || segs != 1 || recsGone != 5 {
		t.Fatalf("retention: %d segments, %d records, %v", segs, recsGone, err)
	}
}

// A peer's NACK evicted cancels the attempt's record: terminal, no budget.
func TestCancelInflight(t *testing.T) {
	f := newLedger(t, nil)
	f.l.EnsureScheduled("seg", []string{"p"}, t0)
	if _, err := f.l.Cancel("seg", "p", errors.New("refused"), t0); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("cancel of a scheduled record: %v", err)
	}
	f.l.TryTransitionInflight("seg", "p", t0)
	r, err := f.l.Cancel("seg", "p", errors.New("peer refused segment: evicted"), t0)
	if err != nil || r.State != StateCancelled || r.BudgetUsed() != 1 {
		t.Fatalf("cancel: %+v %v", r, err)
	}
	if got, _ := f.l.Get("seg", "p"); got.State != StateCancelled || got.LastError != "peer refused segment: evicted" {
		t.Fatalf("read back %+v", got)
	}
	if c, _ := f.l.Counts(); c[StateCancelled] != 1 || c[StateDeadletter] != 0 {
		t.Fatalf("counts %v", c)
	}
	if l, _ := f.l.ListByState(StateDeadletter); len(l) != 0 {
		t.Fatalf("listed as deadletter: %+v", l)
	}
}

// A stored state 6, or the flag on another state, is damage.
func TestCancelledDecodeStrict(t *testing.T) {
	for _, v := range []string{`{"state":6,"attempts":1,"budget_base":0,"updated_ns":1}`, `{"state":3,"attempts":1,"budget_base":0,"updated_ns":1,"cancelled":true}`} {
		if _, err := decode(recKey("s", "p"), []byte(v)); err == nil {
			t.Errorf("%s decoded", v)
		}
	}
}
