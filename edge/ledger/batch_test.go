package ledger

import (
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestClaimBatch: in one transaction, exactly the records a single claim
// would take are claimed (Scheduled, Failed and due), the rest skipped
// unchanged; a second batch claims nothing.
func TestClaimBatch(t *testing.T) {
	f := newLedger(t, &bolt.Options{NoSync: true})
	p := testPolicy
	for _, s := range []string{"sched", "due", "later", "inflight", "acked"} {
		must[[]string](t)(f.l.EnsureScheduled(s, []string{"b"}, t0))
	}
	for _, s := range []string{"due", "later", "inflight", "acked"} {
		must[bool](t)(claimB(f.l, s, t0))
	}
	must[Record](t)(f.l.TransitionFailed("due", "b", errors.New("x"), t0, p))
	r := must[Record](t)(f.l.TransitionFailed("later", "b", errors.New("x"), t0.Add(time.Hour), p))
	must[Record](t)(f.l.TransitionAcked("acked", "b", t0))
	now := t0.Add(time.Minute)
	if !r.NextAttemptAfter.After(now) {
		t.Fatalf("later is due at %v", r.NextAttemptAfter)
	}
	pairs := []Pair{{"sched", "b"}, {"due", "b"}, {"later", "b"}, {"inflight", "b"}, {"acked", "b"}, {"missing", "b"}}
	got, err := f.l.ClaimBatch(pairs, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].SegmentID != "sched" || got[1].SegmentID != "due" {
		t.Fatalf("claimed %+v, want sched and due", got)
	}
	for _, r := range got {
		if r.State != StateInflight || r.Attempts == 0 {
			t.Fatalf("claimed record %+v", r)
		}
	}
	if again := must[[]Record](t)(f.l.ClaimBatch(pairs, now)); len(again) != 0 {
		t.Fatalf("second batch claimed %+v", again)
	}
	if r := must[Record](t)(f.l.Get("later", "b")); r.State != StateFailed {
		t.Fatalf("later: %+v", r)
	}
}

// TestAckBatch: every pair Inflight → Acked in one transaction; one pair
// that is not Inflight refuses the whole batch and changes nothing.
func TestAckBatch(t *testing.T) {
	f := newLedger(t, &bolt.Options{NoSync: true})
	for _, s := range []string{"s1", "s2", "s3"} {
		must[[]string](t)(f.l.EnsureScheduled(s, []string{"b"}, t0))
	}
	must[bool](t)(claimB(f.l, "s1", t0))
	must[bool](t)(claimB(f.l, "s2", t0))
	_, err := f.l.AckBatch([]Pair{{"s1", "b"}, {"s2", "b"}, {"s3", "b"}}, t0)
	var te *TransitionError
	if !errors.As(err, &te) || te.SegmentID != "s3" {
		t.Fatalf("err = %v, want a TransitionError for s3", err)
	}
	if r := must[Record](t)(f.l.Get("s1", "b")); r.State != StateInflight {
		t.Fatalf("s1 changed by a refused batch: %+v", r)
	}
	got := must[[]Record](t)(f.l.AckBatch([]Pair{{"s1", "b"}, {"s2", "b"}}, t0))
	if len(got) != 2 {
		t.Fatalf("acked %+v", got)
	}
	for _, s := range []string{"s1", "s2"} {
		if r := must[Record](t)(f.l.Get(s, "b")); r.State != StateAcked {
			t.Fatalf("%s: %+v", s, r)
		}
	}
}

func claimB(l *Ledger, seg string, now time.Time) (bool, error) {
	_, ok, err := l.TryTransitionInflight(seg, "b", now)
	return ok, err
}
