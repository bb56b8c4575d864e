package relaycore_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// failTargets makes target applies fail for targets with the given prefix
// while *on is true.
func (e *env) failTargets(prefix string, on *bool) {
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && *on && strings.HasPrefix(string(c.P), prefix) {
			return errInjected
		}
		return nil
	}, nil)
}

func TestRegressionOneRowScanPages(t *testing.T) {
	e := newEnv(t, "free")
	e.srcF.scanLimit = 1
	var rows []relaycore.Row
	for i := 0; i < 60; i++ {
		tg := relaycore.Partition(fmt.Sprintf("t%d", i%11))
		rows = append(rows, put(tg, "k", fmt.Sprint(i), fmt.Sprintf("k%d", i), "x"))
	}
	e.enqueue(rows[:30]...)
	e.enqueue(rows[30:]...)
	if st, err := relaycore.SourceRelayState(e.ctx, e.srcF, e.source, e.clock.Now()); err != nil || st.Empty || st.FirstUndelivered != 1 {
		t.Fatalf("source state with one-row scan pages: %+v, %v", st, err)
	}
	e.drain(e.source, 100)
	for i := 0; i < 11; i++ {
		last := 0
		for j := i; j < 60; j += 11 {
			last = j
		}
		if v, _ := e.target(relaycore.Partition(fmt.Sprintf("t%d", i)), "k"); v != fmt.Sprint(last) {
			t.Fatalf("t%d/k = %q, want %d (per-target order)", i, v, last)
		}
	}
	if ok, err := relaycore.RelayDeliveredThrough(e.ctx, e.srcF, e.source, 60); err != nil || !ok {
		t.Fatalf("delivered through 60 = %v, %v", ok, err)
	}
}

func TestRegressionFailingTargetBlocksOnlyItself(t *testing.T) {
	e := newEnv(t, "free")
	failing := true
	e.failTargets("bad", &failing)
	e.enqueue(put("bad", "k", "1"))
	e.enqueue(put("good1", "k", "1"), put("bad", "k", "2"), put("good2", "k", "1"))
	r := e.fire(e.source)
	if r.TargetsBlocked != 1 || r.Blocked != 1 {
		t.Fatalf("fire result %+v: want exactly bad blocked", r)
	}
	for _, g := range []relaycore.Partition{"good1", "good2"} {
		if v, _ := e.target(g, "k"); v != "1" {
			t.Fatalf("%s not delivered while bad fails", g)
		}
	}
	v := e.inspect(e.source)
	if got := v.RS.Blocked; len(got) != 1 || got[0] != "bad" {
		t.Fatalf("blocked = %v", got)
	}
	if len(v.Rows()) != 2 {
		t.Fatalf("%d rows left, want bad's 2", len(v.Rows()))
	}
	checkBlockedInvariant(t, v)
	failing = false
	e.drain(e.source, 20)
	if v, _ := e.target("bad", "k"); v != "2" {
		t.Fatalf("bad/k = %q after recovery, want 2 (in order)", v)
	}
}

// checkBlockedInvariant: during an active cycle every undelivered row in
// the outbox with seq <= cursor has its target in blocked (held rows are
// out of the scan).
func checkBlockedInvariant(t *testing.T, v relaycore.SourceView) {
	t.Helper()
	if v.RS == nil || v.RS.Completed() {
		return
	}
	blocked := map[relaycore.Partition]bool{}
	for _, b := range v.RS.Blocked {
		blocked[b] = true
	}
	for _, p := range v.Pages {
		for _, r := range p.Rows {
			if r.Seq <= v.RS.Cursor && !blocked[r.Target] {
				t.Fatalf("row %d (target %s) <= cursor %d but target not blocked", r.Seq, r.Target, v.RS.Cursor)
			}
		}
	}
}

// The 33rd failing target of a cycle no longer resets the cycle (which
// retried the same targets from the head for ever): its rows are moved aside
// and retried on their own schedule, and the scan goes on.
func TestRegression33rdFailingTargetHeldNotReset(t *testing.T) {
	e := newEnv(t, "free")
	failing := true
	e.failTargets("bad", &failing)
	var rows []relaycore.Row
	for i := 0; i <= relaycore.MaxBlockedTargets; i++ {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("bad%02d", i)), "k", "v"))
	}
	rows = append(rows, put("good", "k", "v"))
	e.enqueue(rows...)
	held := 0
	for f := 0; f < 5; f++ {
		r := e.fire(e.source)
		held += r.TargetsHeld
		v := e.inspect(e.source)
		checkBlockedInvariant(t, v)
		if r.Blocked > relaycore.MaxBlockedTargets {
			t.Fatalf("blocked set grew to %d", r.Blocked)
		}
		if f < 4 && (r.TargetsHeld != 0 || r.NewCycle != (f == 0)) {
			t.Fatalf("fire %d: %+v, want only blocked targets", f, r)
		}
	}
	v := e.inspect(e.source)
	if held != 1 || len(v.RS.Blocked) != relaycore.MaxBlockedTargets || len(v.Held) != 1 || len(v.Retries) != 1 || v.Hold.HeldRows != 1 {
		t.Fatalf("after 5 fires: held %d, rs %+v, held pages %d, markers %+v, q %+v", held, v.RS, len(v.Held), v.Retries, v.Hold)
	}
	if got, ok := e.target("good", "k"); !ok || got != "v" {
		t.Fatalf("good target not delivered in the same cycle: %q %v", got, ok)
	}
	if v.RS.Completed() != true {
		t.Fatalf("cycle not completed after the scan passed every row: %+v", v.RS)
	}
}

func TestRegressionHealthyTargetBehindFailingDelivered(t *testing.T) {
	for _, nbad := range []int{8, 31} {
		t.Run(fmt.Sprint(nbad), func(t *testing.T) {
			e := newEnv(t, "free")
			failing := true
			e.failTargets("bad", &failing)
			var rows []relaycore.Row
			for i := 0; i < nbad; i++ {
				rows = append(rows, put(relaycore.Partition(fmt.Sprintf("bad%02d", i)), "k", "v"))
			}
			rows = append(rows, put("healthy", "k", "v"))
			e.enqueue(rows...)
			for a := 0; a < 40; a++ {
				if v, ok := e.target("healthy", "k"); ok && v == "v" {
					checkBlockedInvariant(t, e.inspect(e.source))
					return
				}
				v := e.inspect(e.source)
				e.clock.Set(timeMS(v.Alarm.DueMS))
				if _, err := e.h.Alarm(e.ctx, e.source); err != nil {
					t.Fatal(err)
				}
				checkBlockedInvariant(t, e.inspect(e.source))
			}
			t.Fatal("healthy target behind failing ones never delivered")
		})
	}
}

func TestRegressionDrain4096Targets(t *testing.T) {
	if testing.Short() {
		t.Skip("4096-target drain")
	}
	for _, plan := range []string{"free", "paid"} {
		t.Run(plan, func(t *testing.T) {
			e := newEnv(t, plan)
			b := e.h.Budget
			rows := make([]relaycore.Row, 4096)
			for i := range rows {
				rows[i] = put(relaycore.Partition(fmt.Sprintf("t%04d", i)), "k", fmt.Sprint(i))
			}
			e.enqueue(rows...)
			bound := (4096+b.TargetsPerFire*b.FiresPerAlarm-1)/(b.TargetsPerFire*b.FiresPerAlarm) + 64
			alarms := 0
			for ; ; alarms++ {
				v := e.inspect(e.source)
				if v.Alarm == nil {
					break
				}
				if alarms >= bound {
					t.Fatalf("%s: not drained within %d alarms (%d rows left)", plan, bound, len(v.Rows()))
				}
				e.clock.Set(timeMS(v.Alarm.DueMS))
				ar, err := e.h.Alarm(e.ctx, e.source)
				if err != nil {
					t.Fatal(err)
				}
				if ar.TargetCalls > b.TargetCallsPerAlarm() {
					t.Fatalf("alarm %d made %d target calls, cap %d", alarms, ar.TargetCalls, b.TargetCallsPerAlarm())
				}
			}
			if rows := e.inspect(e.source).Rows(); len(rows) != 0 {
				t.Fatalf("%d rows left", len(rows))
			}
			t.Logf("%s: 4096 targets drained in %d alarms (bound %d)", plan, alarms, bound)
		})
	}
}

func TestRegressionBlockedTargetSkippedWithinCycle(t *testing.T) {
	e := newEnv(t, "free")
	badCalls := 0
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "bad" {
			badCalls++
			return errInjected
		}
		return nil
	}, nil)
	e.enqueue(put("bad", "k", "1")) // seq 1
	var rows []relaycore.Row
	for i := 0; i < 9; i++ {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("g%d", i)), "k", "1"))
	}
	rows = append(rows, put("bad", "k", "2"))
	e.enqueue(rows...) // g0..g8 = seqs 2..10, bad again at 11: ahead of the cursor
	r1 := e.fire(e.source)
	if r1.TargetsAttempted != 8 || r1.TargetsBlocked != 1 || badCalls != 1 {
		t.Fatalf("fire 1: %+v, bad calls %d", r1, badCalls)
	}
	v := e.inspect(e.source)
	checkBlockedInvariant(t, v)
	if v.RS.Completed() {
		t.Fatal("cycle completed; the target budget should have paused the cursor")
	}
	r2 := e.fire(e.source)
	if badCalls != 1 {
		t.Fatalf("blocked target retried within its cycle (%d calls)", badCalls)
	}
	if r2.TargetsAttempted != 2 || r2.RowsDelivered != 2 {
		t.Fatalf("fire 2: %+v, want g7 and g8 delivered", r2)
	}
	checkBlockedInvariant(t, e.inspect(e.source))
}
