package ledger

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// TestDeferFromEveryState: Defer moves only due-before-until Scheduled and
// Failed records, keeps their state, attempts, budget and last error, and
// leaves every other record byte-for-byte unchanged.
func TestDeferFromEveryState(t *testing.T) {
	until := tOp.Add(time.Minute)
	moves := map[string]bool{
		"absent": false, "scheduled": true, "inflight": false, "acked": false,
		// failed-waiting is due at t0+1h, after until: never brought forward.
		"failed-ready": true, "failed-waiting": false, "deadletter": false,
	}
	for _, s := range starts {
		t.Run(s.name, func(t *testing.T) {
			f := newLedger(t, nil)
			s.setup(t, f.l)
			before := rawRecord(t, f.db, "s", "p")
			var old Record
			if s.state != 0 {
				old = must[Record](t)(f.l.Get("s", "p"))
			}
			moved, err := f.l.Defer(until, tOp, Pair{"s", "p"})
			if err != nil {
				t.Fatal(err)
			}
			if want := moves[s.name]; (len(moved) == 1) != want {
				t.Fatalf("deferred %v, want move=%v", moved, want)
			}
			if !moves[s.name] {
				if !bytes.Equal(before, rawRecord(t, f.db, "s", "p")) {
					t.Fatal("record changed although it was not deferred")
				}
				return
			}
			r := must[Record](t)(f.l.Get("s", "p"))
			if r.State != old.State || r.Attempts != old.Attempts || r.BudgetBase != old.BudgetBase || r.LastError != old.LastError {
				t.Fatalf("deferral changed more than the due time: %+v -> %+v", old, r)
			}
			if !r.NextAttemptAfter.Equal(until) || !r.UpdatedAt.Equal(tOp) {
				t.Fatalf("next %v updated %v, want %v %v", r.NextAttemptAfter, r.UpdatedAt, until, tOp)
			}
			if got := must[[]Record](t)(f.l.Pending(until.Add(-time.Nanosecond), 0)); len(got) != 0 {
				t.Fatalf("deferred record still due before until: %+v", got)
			}
			if got := must[[]Record](t)(f.l.Pending(until, 0)); len(got) != 1 {
				t.Fatalf("deferred record not due at until: %+v", got)
			}
		})
	}
}

// TestDeferKeepsScanOrder: deferred records keep the deterministic
// (NextAttemptAfter, SegmentID, PeerID) order among themselves, and a
// record due earlier than until for another peer is claimed first.
func TestDeferKeepsScanOrder(t *testing.T) {
	f := newLedger(t, nil)
	for _, seg := range []string{"c", "a", "b"} {
		must[[]string](t)(f.l.EnsureScheduled(seg, []string{"dead", "live"}, t0))
	}
	until := t0.Add(time.Hour)
	moved, err := f.l.Defer(until, t0, Pair{"b", "dead"}, Pair{"a", "dead"}, Pair{"c", "dead"}, Pair{"a", "dead"})
	if err != nil || len(moved) != 3 {
		t.Fatalf("Defer = %v, %v; want 3 moved (the repeated pair once)", moved, err)
	}
	var got []string
	for _, r := range must[[]Record](t)(f.l.Pending(until, 0)) {
		got = append(got, r.SegmentID+"/"+r.PeerID)
	}
	want := "[a/live b/live c/live a/dead b/dead c/dead]"
	if s := fmt.Sprint(got); s != want {
		t.Fatalf("pending order %s, want %s", s, want)
	}
	if _, err := f.l.Defer(until, t0, Pair{"", "dead"}); err == nil {
		t.Fatal("Defer accepted an empty segment id")
	}
}
