package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
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

// TestExpedite: the records of one peer that are due later (deferred, or
// failed and backing off) all come due at now, keeping their state and
// attempts; records already due, in flight or terminal, and those of other
// peers, are left alone.
func TestExpedite(t *testing.T) {
	f := newLedger(t, nil)
	for _, seg := range []string{"a", "b", "c", "d", "e"} {
		must[[]string](t)(f.l.EnsureScheduled(seg, []string{"back", "other"}, t0))
	}
	p := Policy{MaxRetries: 5, Initial: time.Hour, Max: time.Hour}
	must[[]Pair](t)(f.l.Defer(t0.Add(time.Hour), t0, Pair{"a", "back"}, Pair{"a", "other"}))
	mustInflight(t, f.l, "b", "back", t0)
	must[Record](t)(f.l.TransitionFailed("b", "back", errors.New("dial: refused"), t0, p))
	mustInflight(t, f.l, "c", "back", t0)
	mustInflight(t, f.l, "d", "back", t0)
	must[Record](t)(f.l.TransitionAcked("d", "back", t0))
	before := map[string][]byte{}
	for _, k := range []string{"c/back", "d/back", "e/back", "a/other"} {
		seg, peer, _ := strings.Cut(k, "/")
		before[k] = rawRecord(t, f.db, seg, peer)
	}
	oldB := must[Record](t)(f.l.Get("b", "back"))
	now := t0.Add(time.Minute)
	n, err := f.l.Expedite("back", now)
	if err != nil || n != 2 {
		t.Fatalf("Expedite = %d, %v; want 2 (a deferred, b backing off)", n, err)
	}
	for k, raw := range before {
		seg, peer, _ := strings.Cut(k, "/")
		if !bytes.Equal(raw, rawRecord(t, f.db, seg, peer)) {
			t.Errorf("%s changed", k)
		}
	}
	b := must[Record](t)(f.l.Get("b", "back"))
	if b.State != StateFailed || b.Attempts != oldB.Attempts || b.LastError != oldB.LastError || !b.NextAttemptAfter.Equal(now) {
		t.Errorf("b/back after Expedite: %+v, was %+v", b, oldB)
	}
	var due []string
	for _, r := range must[[]Record](t)(f.l.Pending(now, 0)) {
		due = append(due, r.SegmentID+"/"+r.PeerID)
	}
	if s, want := fmt.Sprint(due), "[b/other c/other d/other e/back e/other a/back b/back]"; s != want {
		t.Errorf("due at now: %s, want %s", s, want)
	}
}

func mustInflight(t *testing.T, l *Ledger, seg, peer string, now time.Time) {
	t.Helper()
	if _, ok, err := l.TryTransitionInflight(seg, peer, now); err != nil || !ok {
		t.Fatalf("claim %s/%s: %v %v", seg, peer, ok, err)
	}
}
