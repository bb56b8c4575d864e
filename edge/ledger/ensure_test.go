package ledger

import (
	"fmt"
	"testing"
	"time"
)

// TestEnsureScheduledAllOneCommit: scheduling many segments is one write
// transaction, whatever their number, and none when every record exists;
// existing records are kept as they are.
func TestEnsureScheduledAllOneCommit(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("s0003", []string{"q"}, t0))
	mustInflight(t, f.l, "s0003", "q", t0)
	must[Record](t)(f.l.TransitionAcked("s0003", "q", t0))
	owed := make([]Owed, 1000)
	for i := range owed {
		owed[i] = Owed{SegmentID: fmt.Sprintf("s%04d", i), PeerIDs: []string{"p", "q"}}
	}
	now := t0.Add(time.Minute)
	before := commits(t, f.db)
	created := must[[]Pair](t)(f.l.EnsureScheduledAll(owed, now))
	if got := commits(t, f.db) - before; got != 1 {
		t.Fatalf("scheduling 1000 segments committed %d transactions, want 1", got)
	}
	if len(created) != 1999 || created[0] != (Pair{"s0000", "p"}) || created[len(created)-1] != (Pair{"s0999", "q"}) {
		t.Fatalf("created %d pairs (%v … %v), want 1999 in the order given", len(created), created[0], created[len(created)-1])
	}
	if r := must[Record](t)(f.l.Get("s0003", "q")); r.State != StateAcked {
		t.Fatalf("existing record overwritten: %+v", r)
	}
	if r := must[Record](t)(f.l.Get("s0999", "p")); r.State != StateScheduled || !r.NextAttemptAfter.Equal(now) {
		t.Fatalf("new record %+v, want scheduled at %v", r, now)
	}
	before = commits(t, f.db)
	if again := must[[]Pair](t)(f.l.EnsureScheduledAll(owed, now.Add(time.Minute))); len(again) != 0 {
		t.Fatalf("second call created %v", again)
	}
	if got := commits(t, f.db) - before; got != 0 {
		t.Fatalf("nothing to schedule, yet %d transactions committed", got)
	}
	if _, err := f.l.EnsureScheduledAll([]Owed{{SegmentID: "ok", PeerIDs: []string{"p"}}, {SegmentID: "bad\x00id", PeerIDs: []string{"p"}}}, now); err == nil {
		t.Fatal("invalid id accepted")
	}
	if _, err := f.l.Get("ok", "p"); err == nil {
		t.Fatal("a batch with an invalid id wrote part of itself")
	}
}
