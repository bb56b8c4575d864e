package relaycore_test

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

var flagConcSeed = flag.Uint64("concseed", 1, "seed of TestConcurrentDeliveryInvariants' injected target faults")

// rhLink is one committed target batch as its rh guard and write show it:
// the watermark it required (0: absent) and the one it wrote.
type rhLink struct{ prev, next uint64 }

// chainStore wraps a target store: it records every committed batch's rh
// link per target partition, and injects faults decided by a hash of
// (seed, target, that target's apply count), so the faults do not depend
// on how the fire's goroutines interleave. A down target refuses every
// batch; a flaky one refuses some and reports others as outcome unknown
// after they landed (what a timeout after DynamoDB committed looks like).
type chainStore struct {
	relaycore.Store
	source   relaycore.Partition
	seed     uint64
	inflight atomic.Int64
	maxSeen  atomic.Int64

	mu     sync.Mutex
	down   map[relaycore.Partition]bool
	flaky  map[relaycore.Partition]bool
	n      map[relaycore.Partition]int
	links  map[relaycore.Partition][]rhLink
	faults int
}

func (s *chainStore) roll(p relaycore.Partition) (refuse, ambiguous bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[p]++
	if s.down[p] {
		s.faults++
		return true, false
	}
	if !s.flaky[p] {
		return false, false
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", s.seed, p, s.n[p])
	switch r := h.Sum64() % 100; {
	case r < 30:
		s.faults++
		return true, false
	case r < 40:
		s.faults++
		return false, true
	}
	return false, false
}

func (s *chainStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for m := s.maxSeen.Load(); n > m && !s.maxSeen.CompareAndSwap(m, n); m = s.maxSeen.Load() {
	}
	refuse, ambiguous := s.roll(p)
	if refuse {
		return fmt.Errorf("injected: target %s refuses the batch", p)
	}
	err := s.Store.Apply(ctx, p, b)
	if err != nil {
		return err
	}
	rhKey := relaycore.RHKey(s.source)
	var l rhLink
	for _, pc := range b.Preconditions {
		if pc.Key == rhKey && !pc.Absent {
			l.prev, _ = strconv.ParseUint(string(pc.Value), 10, 64)
		}
	}
	for _, w := range b.Writes {
		if w.Key == rhKey {
			l.next, _ = strconv.ParseUint(string(w.Value), 10, 64)
		}
	}
	s.mu.Lock()
	s.links[p] = append(s.links[p], l)
	s.mu.Unlock()
	if ambiguous {
		return fmt.Errorf("injected: %w", relaycore.ErrMaybeApplied)
	}
	return nil
}

// concStores opens a source and a target store of one kind.
type concStores func(t *testing.T) (src, tgt relaycore.Store)

var concBackends = map[string]concStores{
	"mem": func(*testing.T) (relaycore.Store, relaycore.Store) {
		return mem.New(mem.DefaultCapabilities), mem.New(mem.DefaultCapabilities)
	},
	"bolt": func(t *testing.T) (relaycore.Store, relaycore.Store) {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := db.Check(); err != nil {
				t.Error(err)
			}
			db.Close()
		})
		return db.Store("source"), db.Store("target")
	},
	"dynamo": func(t *testing.T) (relaycore.Store, relaycore.Store) {
		client := dynamotest.Start(t).Client(nil)
		for _, tbl := range []string{"source", "target"} {
			if err := dynamo.CreateTable(t.Context(), client, tbl); err != nil {
				t.Fatal(err)
			}
		}
		return dynamo.New(client, "source", dynamo.Options{}), dynamo.New(client, "target", dynamo.Options{})
	},
}

// TestConcurrentDeliveryInvariants: with DeliverConcurrency 8 (the Lambda
// fire function's default) a paid fire delivers to many targets at once on
// every store (mem, bolt, dynamo) and keeps the invariants the sequential
// fire keeps: each target's committed batches form one rh chain (each
// guarded on the watermark the previous one wrote, strictly increasing,
// ending at the target's last seq), so no row is applied twice or out of
// order; rows of targets that failed while the blocked set was full are
// held, then delivered in order once the targets recover; every key ends
// with its newest row's value; the budget caps every alarm's target calls.
// 60 targets: 36 down for the first rounds (more than the blocked set's
// 32, so rows are held), 12 flaky throughout (refusals and commits
// reported as unknown after they landed), 12 healthy. Run with
// -concseed=N for other fault patterns.
func TestConcurrentDeliveryInvariants(t *testing.T) {
	for name, open := range concBackends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := *flagConcSeed
			src, tgt := open(t)
			e := newEnv(t, "paid")
			inspect := func() relaycore.SourceView {
				t.Helper()
				v, err := relaycore.InspectSource(e.ctx, src, e.source)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			cs := &chainStore{Store: tgt, source: e.source, seed: seed, down: map[relaycore.Partition]bool{}, flaky: map[relaycore.Partition]bool{},
				n: map[relaycore.Partition]int{}, links: map[relaycore.Partition][]rhLink{}}
			b, _ := relaycore.PlanBudget("paid")
			e.h = &relaycore.RelayHandler{Source: src, Target: cs, Budget: b, Clock: e.clock, DeliverConcurrency: 8,
				QuarantineAfter: -1, RetryBase: 100 * time.Millisecond, RetryMax: time.Second}
			const targets, rounds = 60, 3
			names := make([]relaycore.Partition, targets)
			for i := range names {
				names[i] = relaycore.Partition(fmt.Sprintf("t%02d", i))
				switch {
				case i < 36:
					cs.down[names[i]] = true
				case i < 48:
					cs.flaky[names[i]] = true
				}
			}
			lastSeq := map[relaycore.Partition]uint64{}
			held := 0
			alarm := func() {
				t.Helper()
				v := inspect()
				held = max(held, len(v.Held))
				if v.Alarm == nil {
					return
				}
				e.clock.Set(time.UnixMilli(max(v.Alarm.DueMS, e.clock.Now().UnixMilli())))
				ar, err := e.h.Alarm(e.ctx, e.source)
				if err != nil {
					t.Fatalf("seed %d: alarm: %v", seed, err)
				}
				if ar.TargetCalls > ar.Fires*b.TargetsPerFire*b.CallsPerTarget {
					t.Fatalf("seed %d: alarm %+v: more target calls than %d fires may make", seed, ar, ar.Fires)
				}
			}
			for round := range rounds {
				var rows []relaycore.Row
				for _, tp := range names {
					rows = append(rows, put(tp, "k", fmt.Sprint(round)), put(tp, fmt.Sprint("r", round), "x"))
				}
				res, err := e.h.Enqueue(e.ctx, e.source, rows, relaycore.EnqueueOptions{})
				if err != nil {
					t.Fatalf("seed %d: enqueue: %v", seed, err)
				}
				for i, s := range res.Seqs {
					lastSeq[rows[i].Target] = max(lastSeq[rows[i].Target], s)
				}
				for range 3 {
					alarm()
				}
			}
			if held == 0 {
				t.Fatalf("seed %d: no row was ever held: the scenario does not reach the hold path", seed)
			}
			cs.mu.Lock()
			clear(cs.down)
			cs.mu.Unlock()
			drainAlarms := 0
			for i := 0; inspect().Alarm != nil; i++ {
				drainAlarms++
				if i > 400 {
					v := inspect()
					t.Fatalf("seed %d: not drained after 400 alarms: %d rows left, %d held", seed, len(v.Rows()), len(v.Held))
				}
				e.clock.Advance(time.Second)
				alarm()
			}
			if v := inspect(); len(v.Rows()) != 0 || len(v.Held) != 0 || len(v.Retries) != 0 {
				t.Fatalf("seed %d: drained source keeps %d rows, %d held pages, %d retry markers", seed, len(v.Rows()), len(v.Held), len(v.Retries))
			}
			cs.mu.Lock()
			defer cs.mu.Unlock()
			for _, tp := range names {
				links := cs.links[tp]
				var prev uint64
				for i, l := range links {
					if l.prev != prev || l.next <= prev {
						t.Errorf("seed %d: %s batch %d of %d: rh %d -> %d after %d: the rh chain is broken", seed, tp, i, len(links), l.prev, l.next, prev)
						break
					}
					prev = l.next
				}
				if prev != lastSeq[tp] {
					t.Errorf("seed %d: %s rh chain ends at %d, want the last seq %d", seed, tp, prev, lastSeq[tp])
				}
				if rh, err := relaycore.TargetWatermark(e.ctx, tgt, tp, e.source); err != nil || rh != lastSeq[tp] {
					t.Errorf("seed %d: %s rh %d (%v), want %d", seed, tp, rh, err, lastSeq[tp])
				}
				for round := range rounds {
					if _, ok, err := tgt.Get(e.ctx, tp, fmt.Sprint("r", round)); err != nil || !ok {
						t.Errorf("seed %d: %s lacks round %d's row (%v)", seed, tp, round, err)
					}
				}
				if v, ok, err := tgt.Get(e.ctx, tp, "k"); err != nil || !ok || string(v) != fmt.Sprint(rounds-1) {
					t.Errorf("seed %d: %s k = %q (%v, %v), want the newest row's %d", seed, tp, v, ok, err, rounds-1)
				}
			}
			if cs.faults == 0 {
				t.Errorf("seed %d: no fault injected", seed)
			}
			t.Logf("seed %d: %d faults injected, at most %d held pages, %d alarms to drain, up to %d target batches in flight", seed, cs.faults, held, drainAlarms, cs.maxSeen.Load())
		})
	}
}
