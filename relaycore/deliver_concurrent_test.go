package relaycore_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// TestDeliverConcurrency: with DeliverConcurrency > 1 a fire applies to
// several targets at once (target batches overlap), keeps every target's
// rows in seq order, never makes more target calls than the budget allows
// (the check and the reservation are one step), and delivers what the
// sequential fire delivers.
func TestDeliverConcurrency(t *testing.T) {
	e := newEnv(t, "paid")
	e.h.DeliverConcurrency = 4
	b, _ := relaycore.PlanBudget("paid")
	b.CallsPerTarget = 1
	e.h.Budget = b

	var (
		mu                sync.Mutex
		inflight, maxSeen int
		applies           = map[relaycore.Partition]int{}
	)
	e.tgtF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		mu.Lock()
		inflight++
		maxSeen = max(maxSeen, inflight)
		applies[c.P]++
		mu.Unlock()
		// Hold the batch until another one overlaps it (bounded: a fire
		// that delivers one target at a time never gets one).
		for i := 0; i < 1_000_000; i++ {
			mu.Lock()
			m := maxSeen
			mu.Unlock()
			if m > 1 {
				break
			}
			runtime.Gosched()
		}
		return nil
	}, func(c call) error {
		mu.Lock()
		inflight--
		mu.Unlock()
		return nil
	})

	const targets, perTarget = 12, 5
	for round := range perTarget {
		var rows []relaycore.Row
		for i := range targets {
			rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%02d", i)), "k", fmt.Sprint(round)))
			rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%02d", i)), fmt.Sprint("r", round), "x"))
		}
		e.enqueue(rows...)
	}
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if ar.Fires < 1 || ar.TargetCalls > ar.Fires*b.TargetsPerFire*b.CallsPerTarget {
		t.Fatalf("alarm %+v: more target calls than %d fires may make", ar, ar.Fires)
	}
	e.drain(e.source, 50)
	mu.Lock()
	defer mu.Unlock()
	if maxSeen < 2 {
		t.Errorf("at most %d target batch in flight: the fire did not overlap targets", maxSeen)
	}
	for i := range targets {
		tp := relaycore.Partition(fmt.Sprintf("t%02d", i))
		if v, _ := e.target(tp, "k"); v != fmt.Sprint(perTarget-1) {
			t.Errorf("%s k = %q, want the newest row's %d", tp, v, perTarget-1)
		}
		if rh, err := relaycore.TargetWatermark(e.ctx, e.tgt, tp, e.source); err != nil || rh == 0 {
			t.Errorf("%s rh %d (%v)", tp, rh, err)
		}
	}
}
