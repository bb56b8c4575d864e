package relaycore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// crashStore fails the first Apply that writes rs once armed: armed after
// a fire's target batches landed, that is the fire's checkpoint, so the
// fire crashes between its target applies and the checkpoint that records
// them.
type crashStore struct {
	relaycore.Store
	armed atomic.Bool
}

func (s *crashStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if slices.ContainsFunc(b.Writes, func(w relaycore.Write) bool { return w.Key == relaycore.KeyRS }) && s.armed.CompareAndSwap(true, false) {
		return errInjected
	}
	return s.Store.Apply(ctx, p, b)
}

// guardCount wraps a target store and counts, per target partition, the
// batches its rh guard refused (a failed precondition) and, when crash is
// set, arms it after every batch that landed.
type guardCount struct {
	relaycore.Store
	crash *crashStore

	mu      sync.Mutex
	refused map[relaycore.Partition]int
}

func (s *guardCount) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	err := s.Store.Apply(ctx, p, b)
	if _, cond := relaycore.FailedPrecondition(err); cond {
		s.mu.Lock()
		s.refused[p]++
		s.mu.Unlock()
	}
	if err == nil && s.crash != nil {
		s.crash.armed.Store(true)
	}
	return err
}

// TestCarriedRHAfterCrash: a fire guards each target's first batch on the
// rh its source's last checkpoint recorded, without reading it; on every
// store (mem, bolt, dynamo: each store's own failed precondition) a fire
// that crashed between its target batches and its checkpoint leaves rh
// ahead of that record, and the next fire's carried guard is refused, it
// reads rh and delivers the rest: each row applied exactly once (one rh
// chain per target, each batch guarded on the rh the previous one wrote),
// the crashed fire's rows recorded delivered without being applied again.
// The fire after it carries the right rh again: no read, one batch.
func TestCarriedRHAfterCrash(t *testing.T) {
	for name, open := range concBackends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src, tgt := open(t)
			e := newEnv(t, "paid")
			crash := &crashStore{Store: src}
			cs := &chainStore{Store: tgt, source: e.source, down: map[relaycore.Partition]bool{}, flaky: map[relaycore.Partition]bool{},
				n: map[relaycore.Partition]int{}, links: map[relaycore.Partition][]rhLink{}}
			gc := &guardCount{Store: cs, refused: map[relaycore.Partition]int{}}
			b, _ := relaycore.PlanBudget("paid")
			e.h = &relaycore.RelayHandler{Source: crash, Target: gc, Budget: b, Clock: e.clock, DeliverConcurrency: 8}
			targets := []relaycore.Partition{"t0", "t1", "t2"}
			lastSeq := map[relaycore.Partition]uint64{}
			enqueue := func(round int) int {
				t.Helper()
				var rows []relaycore.Row
				for _, tp := range targets {
					rows = append(rows, put(tp, "k", fmt.Sprint(round)), put(tp, fmt.Sprint("r", round), "x"))
				}
				res, err := e.h.Enqueue(e.ctx, e.source, rows, relaycore.EnqueueOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for i, s := range res.Seqs {
					lastSeq[rows[i].Target] = max(lastSeq[rows[i].Target], s)
				}
				return len(rows)
			}
			fire := func(what string, wantRows, wantCalls, wantReads, wantRefused int) {
				t.Helper()
				gc.mu.Lock()
				clear(gc.refused)
				gc.mu.Unlock()
				r, err := e.h.Fire(e.ctx, e.source)
				if err != nil {
					t.Fatalf("%s: fire: %v", what, err)
				}
				n := len(targets)
				if r.RowsDelivered != wantRows || r.TargetCalls != wantCalls*n || r.TargetReads != wantReads*n {
					t.Fatalf("%s: %d rows delivered, %d target calls, %d rh reads; want %d, %d, %d", what, r.RowsDelivered, r.TargetCalls, r.TargetReads, wantRows, wantCalls*n, wantReads*n)
				}
				gc.mu.Lock()
				defer gc.mu.Unlock()
				for _, tp := range targets {
					if gc.refused[tp] != wantRefused {
						t.Fatalf("%s: %s: %d batches refused by the rh guard, want %d", what, tp, gc.refused[tp], wantRefused)
					}
				}
			}
			// First delivery: no record yet, so the carried rh is "absent",
			// which it is: one batch per target, no read.
			rows := enqueue(0)
			fire("first", rows, 1, 0, 0)
			rows = enqueue(1)
			fire("steady", rows, 1, 0, 0)

			// The crash: a fire that may collect one round applies it and
			// does not record it; the next round waits behind it.
			crashed := enqueue(2)
			next := enqueue(3)
			e.h.Budget.RowsPerFire = crashed
			gc.crash = crash
			if _, err := e.h.Fire(e.ctx, e.source); err == nil {
				t.Fatal("the crashed fire's checkpoint landed")
			}
			gc.crash = nil
			crash.armed.Store(false)
			e.h.Budget.RowsPerFire = b.RowsPerFire
			if got := len(inspectOn(t, e, src).Rows()); got != crashed+next {
				t.Fatalf("%d rows in the outbox after the crash, want %d (%d applied but unrecorded)", got, crashed+next, crashed)
			}
			// Both rounds: the carried guard (round 1's rh) is refused, rh is
			// read, the crashed round is recorded without a batch and the
			// next one applied in one.
			fire("after the crash", crashed+next, 2, 1, 1)
			// The checkpoint recorded rh as read and applied: carried again.
			rows = enqueue(4)
			fire("after recovery", rows, 1, 0, 0)

			if v := inspectOn(t, e, src); len(v.Rows()) != 0 {
				t.Fatalf("%d rows left", len(v.Rows()))
			}
			cs.mu.Lock()
			defer cs.mu.Unlock()
			for _, tp := range targets {
				links := cs.links[tp]
				if len(links) != 5 {
					t.Errorf("%s: %d target batches landed, want 5 (one per round, none twice)", tp, len(links))
				}
				var prev uint64
				for i, l := range links {
					if l.prev != prev || l.next <= prev {
						t.Errorf("%s batch %d of %d: rh %d -> %d after %d: a row was applied twice or skipped", tp, i, len(links), l.prev, l.next, prev)
						break
					}
					prev = l.next
				}
				if prev != lastSeq[tp] {
					t.Errorf("%s: rh chain ends at %d, want the last seq %d", tp, prev, lastSeq[tp])
				}
				if v, ok, err := tgt.Get(e.ctx, tp, "k"); err != nil || !ok || string(v) != "4" {
					t.Errorf("%s: k = %q (%v, %v), want the newest row's 4", tp, v, ok, err)
				}
			}
		})
	}
}

func inspectOn(t *testing.T, e *env, src relaycore.Store) relaycore.SourceView {
	t.Helper()
	v, err := relaycore.InspectSource(e.ctx, src, e.source)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCarriedRHAboveTarget: a carried rh above the target's (a target
// restored from an older backup, outside the contract) is refused like any
// wrong guess: the fire reads rh and delivers from what it says, skipping
// nothing on the carried value's word.
func TestCarriedRHAboveTarget(t *testing.T) {
	e := newEnv(t, "paid")
	e.enqueue(put("t", "a", "1"), put("t", "b", "2"))
	e.drain(e.source, 10)
	rhKey := relaycore.RHKey(e.source)
	if err := e.tgt.Apply(e.ctx, "t", relaycore.Batch{Writes: []relaycore.Write{{Key: rhKey, Delete: true}, {Key: "a", Delete: true}}}); err != nil {
		t.Fatal(err)
	}
	res := e.enqueue(put("t", "c", "3"))
	r := e.fire(e.source)
	if r.TargetCalls != 2 || r.TargetReads != 1 || r.RowsDelivered != 1 {
		t.Fatalf("fire: %d target calls, %d rh reads, %d rows delivered; want 2 (one refused), 1, 1", r.TargetCalls, r.TargetReads, r.RowsDelivered)
	}
	if v, ok := e.target("t", "c"); v != "3" || !ok {
		t.Fatalf("c = %q, %v: the row was skipped on the carried rh", v, ok)
	}
	if rh, err := relaycore.TargetWatermark(e.ctx, e.tgt, "t", e.source); err != nil || rh != res.Seqs[0] {
		t.Fatalf("rh %d (%v), want %d", rh, err, res.Seqs[0])
	}
	// The checkpoint recorded rh as the delivery left it: carried again.
	e.enqueue(put("t", "d", "4"))
	r = e.fire(e.source)
	if v, ok := e.target("t", "d"); v != "4" || !ok || r.RowsDelivered != 1 || r.TargetCalls != 1 || r.TargetReads != 0 {
		t.Fatalf("next fire: d = %q, %v, %d rows delivered, %d target calls, %d rh reads; want 4, 1, 1, 0", v, ok, r.RowsDelivered, r.TargetCalls, r.TargetReads)
	}
}
