package ledger

import (
	"fmt"
	"testing"
	"time"
)

// TestReleaseDeferredRestoresDueTime: a deferral remembers the due time it
// replaced (the first one, across repeated deferrals), and ReleaseDeferred
// (start-up) puts it back without touching state, attempts or budget. A
// record claimed, failed or expedited since is not deferred any more, and
// its own back-off is left alone.
func TestReleaseDeferredRestoresDueTime(t *testing.T) {
	f := newLedger(t, nil)
	for _, s := range []string{"a", "b", "c", "d"} {
		must[[]string](t)(f.l.EnsureScheduled(s, []string{"p"}, t0))
	}
	// b failed once: due at t0+1s+Backoff(1) = t0+2s.
	mustInflight(t, f.l, "b", "p", t0.Add(time.Second))
	must[Record](t)(f.l.TransitionFailed("b", "p", fmt.Errorf("refused"), t0.Add(time.Second), testPolicy))
	bFailed := must[Record](t)(f.l.Get("b", "p"))

	now := t0.Add(3 * time.Second)
	for _, until := range []time.Time{now.Add(time.Minute), now.Add(5 * time.Minute)} {
		if moved := must[[]Pair](t)(f.l.Defer(until, now, Pair{"a", "p"}, Pair{"b", "p"}, Pair{"c", "p"}, Pair{"d", "p"})); len(moved) != 4 {
			t.Fatalf("deferred %v, want all four", moved)
		}
	}
	if r := must[Record](t)(f.l.Get("b", "p")); !r.DeferredFrom.Equal(bFailed.NextAttemptAfter) {
		t.Fatalf("deferred twice: DeferredFrom %v, want the first due time %v", r.DeferredFrom, bFailed.NextAttemptAfter)
	}
	// Expedited (the peer came back), a record is not deferred any more;
	// c is then claimed and fails (its back-off is its own); a and b are
	// deferred again, from now.
	if n := must[int](t)(f.l.Expedite("p", now)); n != 4 {
		t.Fatalf("expedited %d, want 4", n)
	}
	if r := must[Record](t)(f.l.Get("d", "p")); !r.DeferredFrom.IsZero() {
		t.Fatalf("an expedited record kept its deferral: %+v", r)
	}
	mustInflight(t, f.l, "c", "p", now)
	cFailed := must[Record](t)(f.l.TransitionFailed("c", "p", fmt.Errorf("refused"), now, testPolicy))
	if !cFailed.DeferredFrom.IsZero() {
		t.Fatalf("a claimed record kept its deferral: %+v", cFailed)
	}
	must[[]Pair](t)(f.l.Defer(now.Add(5*time.Minute), now, Pair{"a", "p"}, Pair{"b", "p"}))

	restart := now.Add(time.Minute)
	if n := must[int](t)(f.l.ReleaseDeferred(restart)); n != 2 {
		t.Fatalf("released %d deferrals, want a and b", n)
	}
	for _, c := range []struct {
		seg   string
		state State
		next  time.Time
		tries int
	}{
		{"a", StateScheduled, now, 0},
		{"b", StateFailed, now, 1},
		{"c", StateFailed, cFailed.NextAttemptAfter, 1},
		{"d", StateScheduled, now, 0},
	} {
		r := must[Record](t)(f.l.Get(c.seg, "p"))
		if r.State != c.state || !r.NextAttemptAfter.Equal(c.next) || r.Attempts != c.tries || !r.DeferredFrom.IsZero() {
			t.Errorf("%s after release: %+v, want %s due %v after %d attempts, not deferred", c.seg, r, c.state, c.next, c.tries)
		}
	}
	before := commits(t, f.db)
	if n := must[int](t)(f.l.ReleaseDeferred(restart)); n != 0 {
		t.Fatalf("second release moved %d", n)
	}
	if got := commits(t, f.db) - before; got != 0 {
		t.Fatalf("a release with nothing to release committed %d transactions", got)
	}
}

// TestReleaseDeferredFirstDeferral: Defer keeps the due time it replaced
// the first time only; a record deferred before it was due (not what the
// relay does, but the API allows it) gets its own later time back.
func TestReleaseDeferredFirstDeferral(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("s", []string{"p"}, t0.Add(time.Hour)))
	must[[]Pair](t)(f.l.Defer(t0.Add(2*time.Hour), t0, Pair{"s", "p"}))
	must[int](t)(f.l.ReleaseDeferred(t0))
	if r := must[Record](t)(f.l.Get("s", "p")); !r.NextAttemptAfter.Equal(t0.Add(time.Hour)) {
		t.Fatalf("released to %v, want the record's own %v", r.NextAttemptAfter, t0.Add(time.Hour))
	}
}

// TestRecoverCommitsNothingWhenClean: a start with nothing to repair
// reads the records once (it read them once per step, four times,
// before) and commits no write transaction (each would cost two fsyncs).
func TestRecoverCommitsNothingWhenClean(t *testing.T) {
	f := newLedger(t, nil)
	for i := range 50 {
		must[[]string](t)(f.l.EnsureScheduled(fmt.Sprintf("s%02d", i), []string{"p", "q"}, t0))
	}
	mustInflight(t, f.l, "s00", "p", t0)
	must[Record](t)(f.l.TransitionAcked("s00", "p", t0))
	mustInflight(t, f.l, "s01", "p", t0)
	must[Record](t)(f.l.TransitionFailed("s01", "p", fmt.Errorf("x"), t0, testPolicy)) // due t0+1s
	before, reads := commits(t, f.db), f.db.Stats().TxN
	rep := must[RecoveryReport](t)(f.l.Recover(t0, testPolicy, heldBy(func(string) bool { return true })))
	if rep != (RecoveryReport{}) {
		t.Fatalf("clean ledger: %+v", rep)
	}
	if got := f.db.Stats().TxN - reads; got != 1 {
		t.Fatalf("Recover on a clean ledger read the records %d times, want once", got)
	}
	if got := commits(t, f.db) - before; got != 0 {
		t.Fatalf("Recover on a clean ledger committed %d write transactions, want 0", got)
	}
	rep = must[RecoveryReport](t)(f.l.Recover(t0.Add(time.Second), testPolicy, heldBy(func(string) bool { return true })))
	if rep.Rescheduled != 1 || commits(t, f.db)-before != 1 {
		t.Fatalf("one due failure: %+v in %d commits, want 1 rescheduled in 1", rep, commits(t, f.db)-before)
	}
}

// TestPostponeKeepsBudget: refusals for want of room never spend the
// retry budget nor deadletter, however many; a real failure afterwards
// is the budget's first.
func TestPostponeKeepsBudget(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("s", []string{"p"}, t0))
	now := t0
	for i := range 3 * testPolicy.MaxRetries {
		mustInflight(t, f.l, "s", "p", now)
		until := now.Add(time.Minute)
		r := must[Record](t)(f.l.Postpone("s", "p", fmt.Errorf("peer refused segment: quota"), until, now))
		if r.State != StateFailed || r.BudgetUsed() != 0 || r.Attempts != i+1 || !r.NextAttemptAfter.Equal(until) || r.LastError == "" {
			t.Fatalf("refusal %d: %+v", i+1, r)
		}
		now = until
	}
	mustInflight(t, f.l, "s", "p", now)
	r := must[Record](t)(f.l.TransitionFailed("s", "p", fmt.Errorf("checksum"), now, testPolicy))
	if r.State != StateFailed || r.BudgetUsed() != 1 || !r.NextAttemptAfter.Equal(now.Add(testPolicy.Backoff(1))) {
		t.Fatalf("first real failure after the refusals: %+v", r)
	}
}
