package relaycore_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Behaviours that only the simulation used to catch, each pinned by a unit
// test that fails when the behaviour breaks.

// The blocked set never exceeds MaxBlockedTargets, also when the targets
// per fire do not divide it (5: a fire that starts with 30 blocked meets 5
// more failures; with 8 or 32 a fire always lands exactly on the cap). The
// size is checked after every fire.
func TestBlockedSetCapWithUnevenBudget(t *testing.T) {
	for _, perFire := range []int{5, 7, 3} {
		t.Run(fmt.Sprint(perFire), func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 2, TargetsPerFire: perFire, CallsPerTarget: 1, RowsPerFire: 256}
			e.h.QuarantineAfter = -1
			failing := true
			e.failTargets("bad", &failing)
			const n = relaycore.MaxBlockedTargets + 8
			var rows []relaycore.Row
			for i := 0; i < n; i++ {
				rows = append(rows, put(relaycore.Partition(fmt.Sprintf("bad%02d", i)), "k", "v"))
			}
			rows = append(rows, put("healthy", "k", "v"))
			e.enqueue(rows...)
			full, held := false, 0
			for fires := 0; ; fires++ {
				if fires > 200 {
					t.Fatal("healthy row not delivered in 200 fires")
				}
				res, err := e.h.Fire(e.ctx, e.source)
				if err != nil {
					t.Fatal(err)
				}
				v := e.inspect(e.source)
				if res.Blocked > relaycore.MaxBlockedTargets || len(v.RS.Blocked) > relaycore.MaxBlockedTargets {
					t.Fatalf("fire %d: blocked set of %d (rs %d), limit %d", fires, res.Blocked, len(v.RS.Blocked), relaycore.MaxBlockedTargets)
				}
				full = full || len(v.RS.Blocked) == relaycore.MaxBlockedTargets
				held += res.TargetsHeld
				if got, _ := e.target("healthy", "k"); got == "v" {
					break
				}
			}
			if !full || held == 0 {
				t.Fatalf("the blocked set never filled (%v) or nothing was held (%d): the test did not reach the cap", full, held)
			}
		})
	}
}

// Rows enqueued while a cycle runs wait for the next cycle: the fire after
// the enqueue keeps the cycle's end, its cursor stays at or below it, and
// the new row is not delivered until a new cycle starts.
func TestMidCycleRowsWaitForNextCycle(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 1, TargetsPerFire: 1, CallsPerTarget: 1, RowsPerFire: 8}
	for _, tg := range []relaycore.Partition{"a", "b", "c", "d"} {
		e.enqueue(put(tg, "k", "1"))
	}
	res, err := e.h.Fire(e.ctx, e.source)
	if err != nil || !res.NewCycle || res.CycleEnd != 4 || res.Cursor >= res.CycleEnd {
		t.Fatalf("first fire: %+v, %v (want a new cycle through 4, not completed)", res, err)
	}
	e.enqueue(put("late", "k", "1"))
	for fire := 2; ; fire++ {
		res, err := e.h.Fire(e.ctx, e.source)
		if err != nil {
			t.Fatal(err)
		}
		if res.NewCycle {
			break
		}
		if res.CycleEnd != 4 || res.Cursor > res.CycleEnd {
			t.Fatalf("fire %d mid-cycle: cursor %d, cycle_end %d (want cycle_end 4, cursor <= it)", fire, res.Cursor, res.CycleEnd)
		}
		if _, ok := e.target("late", "k"); ok {
			t.Fatalf("fire %d delivered the row enqueued mid-cycle within the cycle", fire)
		}
		if fire > 10 {
			t.Fatal("the cycle did not complete")
		}
	}
	e.drain(e.source, 10)
	if got, _ := e.target("late", "k"); got != "1" {
		t.Fatalf("late/k = %q after the next cycle", got)
	}
}

// A target held for retry (it failed with the blocked set full) that gets a
// newer row before its retry marker is due has that row moved aside behind
// its held row, not delivered ahead of it, even once the target is healthy
// again; when the marker is due both arrive, in order.
func TestHeldTargetNewerRowMovedAside(t *testing.T) {
	e := newEnv(t, "free")
	e.h.QuarantineAfter = -1
	var mu sync.Mutex
	xFailing := true
	var applied []string // x/k values in apply order
	e.tgtF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(string(c.P), "bad") || (c.P == "x" && xFailing) {
			return errInjected
		}
		if c.P == "x" {
			for _, w := range c.Batch.Writes {
				if w.Key == "k" {
					applied = append(applied, string(w.Value))
				}
			}
		}
		return nil
	}, nil)
	var rows []relaycore.Row
	for i := 0; i < relaycore.MaxBlockedTargets; i++ {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("bad%02d", i)), "k", "v"))
	}
	rows = append(rows, put("x", "k", "old", "o", "1"))
	e.enqueue(rows...)
	for fires := 0; status(t, e, "x").Held == 0; fires++ {
		if fires > 20 {
			t.Fatal("x not held for retry")
		}
		if _, err := e.h.Fire(e.ctx, e.source); err != nil {
			t.Fatal(err)
		}
	}
	s := status(t, e, "x")
	if s.State != relaycore.StateActive || s.RetryMS <= e.clock.Now().UnixMilli() {
		t.Fatalf("x held, but not for a later retry: %+v", s)
	}
	mu.Lock()
	xFailing = false
	mu.Unlock()
	e.enqueue(put("x", "k", "new"))
	// The clock stands still: x's marker is not due during these fires.
	for fires := 0; status(t, e, "x").Held < 2; fires++ {
		if fires > 40 {
			t.Fatalf("x's newer row not moved aside: %+v", status(t, e, "x"))
		}
		if _, err := e.h.Fire(e.ctx, e.source); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := slices.Clone(applied)
		mu.Unlock()
		if len(got) > 0 {
			t.Fatalf("x/k applied %v before its retry was due", got)
		}
	}
	e.clock.Set(time.UnixMilli(status(t, e, "x").RetryMS))
	for fires := 0; status(t, e, "x").Held > 0; fires++ {
		if fires > 40 {
			t.Fatalf("x's held rows not redriven: %+v", status(t, e, "x"))
		}
		if _, err := e.h.Fire(e.ctx, e.source); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// One target batch may carry both rows (writes of one key coalesce).
	if got, _ := e.target("x", "k"); got != "new" || applied[len(applied)-1] != "new" {
		t.Fatalf("x/k = %q, applied %v: want new last", got, applied)
	}
	if got, _ := e.target("x", "o"); got != "1" {
		t.Fatalf("x/o = %q: the held row was not delivered", got)
	}
}

// A skip that takes a whole held page, then a release: the skipped rows are
// never applied, the rest are.
func TestSkipWholeHeldPageNeverApplied(t *testing.T) {
	e := newEnv(t, "free")
	var mu sync.Mutex
	applied := map[string]bool{}
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "t" {
			mu.Lock()
			defer mu.Unlock()
			for _, w := range c.Batch.Writes {
				applied[w.Key] = true
			}
		}
		return nil
	}, nil)
	e.enqueue(put("t", "a", "1"), put("t", "b", "2")) // one page: seqs 1, 2
	e.enqueue(put("t", "c", "3"))                     // another: seq 3
	if _, err := e.h.Quarantine(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 10)
	v := e.inspect(e.source)
	if len(v.Held) != 2 || len(v.Held[0].Rows) != 2 {
		t.Fatalf("held pages %+v, want [1 2] and [3]", v.Held)
	}
	res, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 2, Actor: relaycore.Actor{By: "op", Reason: "poison page"}})
	if err != nil || res.Rows != 2 {
		t.Fatalf("skip: %+v, %v", res, err)
	}
	if _, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 10)
	mu.Lock()
	defer mu.Unlock()
	if applied["a"] || applied["b"] || !applied["c"] {
		t.Fatalf("applied keys %v: want c only", applied)
	}
	if s := status(t, e, "t"); s.Pending != 0 || s.Held != 0 || s.Skipped != 2 {
		t.Fatalf("after the release: %+v", s)
	}
}

// Requeue retried after its rows committed but before the archive entry
// recorded their seqs returns the same seqs and enqueues nothing more: its
// idempotency key finds the first commit.
func TestRequeueRetriedAfterCommitReturnsSameSeqs(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "poison"))
	if _, err := e.h.Quarantine(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{By: "op", Reason: "poison"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	// The requeue's second batch (the entry recording the seqs) fails once.
	applies, failed := 0, false
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			applies++
			if applies == 2 && !failed {
				failed = true
				return errInjected
			}
		}
		return nil
	}, nil)
	first, err := relaycore.Requeue(e.ctx, e.srcF, e.clock, e.source, 1, relaycore.EnqueueConfig{})
	if err == nil || !failed || len(first) != 1 {
		t.Fatalf("requeue with its record failing: %v, %v (failed %v)", first, err, failed)
	}
	e.srcF.set(nil, nil)
	if entry, _, err := relaycore.GetArchive(e.ctx, e.src, e.source, 1); err != nil || len(entry.Requeued) != 0 {
		t.Fatalf("entry %+v, %v: want no seqs recorded yet", entry, err)
	}
	again, err := relaycore.Requeue(e.ctx, e.srcF, e.clock, e.source, 1, relaycore.EnqueueConfig{})
	if err != nil || !slices.Equal(again, first) {
		t.Fatalf("requeue again: %v, %v; want the first commit's seqs %v", again, err, first)
	}
	if entry, _, err := relaycore.GetArchive(e.ctx, e.src, e.source, 1); err != nil || !slices.Equal(entry.Requeued, first) {
		t.Fatalf("entry %+v, %v: want seqs %v recorded", entry, err, first)
	}
	if s := status(t, e, "t"); s.Enqueued != 2 {
		t.Fatalf("t enqueued %d rows, want 2 (the row and one requeue)", s.Enqueued)
	}
}
