package relaycore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// An alarm that leaves rows reports the lower bound of their commit times
// its re-arm read (AlarmResult.LowerBoundMS), and it is what
// SourceRelayState answers right after, so a runtime reporting the oldest
// undelivered age needs no read of its own: with a backlog its budget
// could not finish, and with rows that came while it ran.
func TestAlarmReportsLowerBound(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 1, TargetsPerFire: 4, CallsPerTarget: 1, RowsPerFire: 3}
	for i := range 4 {
		e.enqueue(put("t1", fmt.Sprintf("k%d", i), "v"), put("t2", fmt.Sprintf("k%d", i), "v"))
		e.clock.Advance(time.Second) // each batch its own commit time
	}
	check := func(when string, ar relaycore.AlarmResult) {
		t.Helper()
		st, err := relaycore.SourceRelayState(e.ctx, e.src, e.source, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st.Empty || ar.Cleared {
			t.Fatalf("%s: empty %v, cleared %v; the test wants rows left", when, st.Empty, ar.Cleared)
		}
		if ar.LowerBoundMS == 0 || ar.LowerBoundMS != st.LowerBoundMS {
			t.Fatalf("%s: the alarm reports lower bound %d, SourceRelayState %d", when, ar.LowerBoundMS, st.LowerBoundMS)
		}
	}
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if !ar.More {
		t.Fatalf("alarm %+v; want its budget spent before the rows (More)", ar)
	}
	check("backlog", ar)
	firstBound := ar.LowerBoundMS
	// Rows that arrive while the next alarm delivers: the bound moves on
	// to the oldest row left.
	e.srcF.set(nil, func(c call) error {
		if c.Op == "apply" && c.Key == relaycore.KeyRS {
			e.srcF.set(nil, nil)
			e.enqueue(put("t3", "late", "v"))
		}
		return nil
	})
	e.clock.Advance(time.Second)
	if ar, err = e.h.Alarm(e.ctx, e.source); err != nil {
		t.Fatal(err)
	}
	check("rows during the alarm", ar)
	if ar.LowerBoundMS <= firstBound {
		t.Fatalf("lower bound %d after a second alarm delivered the oldest rows; want past %d", ar.LowerBoundMS, firstBound)
	}
	e.drain(e.source, 20)
}

// heldRow enqueues a row for t1 and quarantines t1, which holds it, then
// moves the clock a minute on; it returns the held row's commit time.
func heldRow(t *testing.T, e *env) int64 {
	t.Helper()
	held := e.clock.Now().UnixMilli()
	e.enqueue(put("t1", "k", "v"))
	if _, err := e.h.Quarantine(e.ctx, e.source, "t1", relaycore.Actor{By: "op", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	return held
}

// Held rows bound the commit times too: a quarantined target's row,
// older than every row left in the outbox, is the lower bound
// SourceRelayState answers and an alarm that leaves rows reports.
func TestLowerBoundCountsHeldRows(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 1, TargetsPerFire: 4, CallsPerTarget: 1, RowsPerFire: 1}
	held := heldRow(t, e)
	e.enqueue(put("t2", "k1", "v"))
	e.enqueue(put("t2", "k2", "v"))
	st, err := relaycore.SourceRelayState(e.ctx, e.src, e.source, e.clock.Now())
	if err != nil || st.LowerBoundMS != held {
		t.Fatalf("source state lower bound %d (%v), want the held row's commit time %d", st.LowerBoundMS, err, held)
	}
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if ar.Cleared || ar.LowerBoundMS != held {
		t.Fatalf("alarm %+v: lower bound %d, want the held row's %d", ar, ar.LowerBoundMS, held)
	}
}

// An alarm that clears the outbox while a quarantined target still holds
// rows reports their bound too: they are undelivered (SourceRelayState is
// not Empty), and a runtime that read 0 from a cleared alarm would report
// a quarantine as an age of 0 until its next refresh.
func TestClearedAlarmReportsHeldRows(t *testing.T) {
	e := newEnv(t, "free")
	held := heldRow(t, e)
	e.enqueue(put("t2", "k", "v"))
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if !ar.Cleared || ar.Hold.HeldRows != 1 {
		t.Fatalf("alarm %+v; the test wants the outbox cleared with t1's row held", ar)
	}
	st, err := relaycore.SourceRelayState(e.ctx, e.src, e.source, e.clock.Now())
	if err != nil || st.Empty || st.LowerBoundMS != held {
		t.Fatalf("source state %+v (%v); want the held row's commit time %d", st, err, held)
	}
	if ar.LowerBoundMS != held {
		t.Fatalf("cleared alarm: lower bound %d, want the held row's %d", ar.LowerBoundMS, held)
	}
	// Released and delivered: nothing is held and the bound is gone.
	if _, err := e.h.Release(e.ctx, e.source, "t1", relaycore.Actor{By: "op", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 20)
	if ar, err = e.h.Alarm(e.ctx, e.source); err != nil || !ar.Cleared || ar.LowerBoundMS != 0 {
		t.Fatalf("alarm after the release %+v (%v); want cleared with no bound", ar, err)
	}
}
