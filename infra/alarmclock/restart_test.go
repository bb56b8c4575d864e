package alarmclock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// PostgreSQL restarted (as a crash: immediate shutdown) under load, with
// three replicas' clocks running on it and four writers enqueueing through
// them: the writers retry a refused or unanswered batch with its
// idempotency key, as producers do; nothing is restarted but the database.
// Afterwards every acknowledged row is at its target once, in seq order
// per (source, target) (each target's last/<source> key holds the row of
// the highest seq), and the clocks fired successfully after the restart:
// they recovered by themselves. Not "every replica fired": the three
// clocks share one pool here, so that would prove nothing more, and which
// clock wins the claims after the restart is up to the scheduler (under
// load one of them may win none: seen in make test). Each process
// recovering on its own pool is TestReplicasKilledInTurn's (relay serve
// processes, internal/relayserve).
func TestReplicasSurviveDatabaseRestart(t *testing.T) {
	const (
		nSources, writers, perBatch, targets = 6, 4, 5, 3
		restartAfter, batchesEach            = 12, 10 // acknowledged batches before the restart; batches per writer
	)
	c := pgtest.Private(t)
	pool := pgtest.Pool(t, c.NewDatabase(t), 8)
	db, err := postgres.Open(t.Context(), pool, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := shared{db.Store("source"), db.Store("target"), db.Store("source")}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)

	var restarted sync.WaitGroup
	restarted.Add(1)
	var mu sync.Mutex
	after := false                  // the restart is done
	firedAfter := map[string]bool{} // replicas with a successful alarm after it
	observed := make(chan struct{}, 1)
	rs := newReplicasTTL(s, 3, relaycore.SystemClock{}, time.Second, time.Second, nil, nil)
	// Re-make the clocks with an observer that notes each replica's
	// successful alarms after the restart.
	for _, r := range rs {
		r.clock = alarmclock.New(alarmclock.Config{
			Handler: r.h, Index: s.index, Source: s.src, Replica: r.name, SweepInterval: time.Second,
			Observe: func(_ relaycore.Partition, res relaycore.AlarmResult, err error) {
				mu.Lock()
				if after && err == nil && !res.Busy {
					firedAfter[r.name] = true
				}
				mu.Unlock()
				select {
				case observed <- struct{}{}:
				default:
				}
			},
		})
		r.h.Kicker = r.clock
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { r.clock.Run(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()

	type acked struct {
		source relaycore.Partition
		rows   []relaycore.Row
		seqs   []uint64
	}
	var (
		ackMu    sync.Mutex
		acks     []acked
		retries  int
		restartC = make(chan struct{})
		once     sync.Once
	)
	var ww sync.WaitGroup
	for w := range writers {
		ww.Go(func() {
			rnd := newRand(seed + int64(w))
			for b := range batchesEach {
				src := sourceName(rnd.IntN(nSources))
				key := fmt.Sprintf("w%d-b%d", w, b)
				rows := make([]relaycore.Row, perBatch)
				for i := range rows {
					id := fmt.Sprintf("%s-%d", key, i)
					tgt := relaycore.Partition(fmt.Sprintf("%s.t%d", src, rnd.IntN(targets)))
					rows[i] = relaycore.Row{Target: tgt, Puts: []relaycore.KV{{Key: "row/" + id, Value: []byte(id)}, {Key: "last/" + string(src), Value: []byte(id)}}}
				}
				// A producer's loop: the same key until answered. Each
				// attempt goes to the next replica, as a load balancer
				// would send a retry elsewhere.
				for attempt := 0; ; attempt++ {
					r := rs[(w+b+attempt)%len(rs)]
					res, err := r.h.Enqueue(ctx, src, rows, relaycore.EnqueueOptions{IdempotencyKey: key})
					if err == nil {
						ackMu.Lock()
						acks = append(acks, acked{src, rows, res.Seqs})
						n := len(acks)
						ackMu.Unlock()
						if n >= restartAfter {
							once.Do(func() { close(restartC) })
						}
						break
					}
					if ctx.Err() != nil {
						return
					}
					ackMu.Lock()
					retries++
					ackMu.Unlock()
					select {
					case <-restartC:
						restarted.Wait() // the database is back (or coming back): retry
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}
	<-restartC
	c.Restart(t)
	mu.Lock()
	after = true
	mu.Unlock()
	restarted.Done()
	ww.Wait()
	if t.Failed() {
		return
	}

	guard, stop := context.WithTimeout(ctx, 2*time.Minute) // a hang, not a timing assertion
	defer stop()
	sources := map[relaycore.Partition]bool{}
	for _, a := range acks {
		sources[a.source] = true
	}
	for drained := false; !drained; {
		drained = true
		for src := range sources {
			st, err := relaycore.SourceRelayState(guard, s.src, src, time.Now())
			drained = drained && err == nil && st.Empty
		}
		mu.Lock()
		all := len(firedAfter) > 0
		mu.Unlock()
		if !drained || !all {
			drained = false
			select {
			case <-observed:
			case <-guard.Done():
				t.Fatalf("not drained, or no clock fired after the restart (%v; seed %d)", firedAfter, seed)
			}
		}
	}

	type pair struct{ source, target relaycore.Partition }
	last := map[pair]uint64{}
	lastID := map[pair]string{}
	for _, a := range acks {
		for i, r := range a.rows {
			id := string(r.Puts[0].Value)
			v, ok, err := s.dst.Get(ctx, r.Target, r.Puts[0].Key)
			if err != nil || !ok || string(v) != id {
				t.Fatalf("acknowledged row %s missing at %s: %q %v %v (seed %d)", id, r.Target, v, ok, err, seed)
			}
			k := pair{a.source, r.Target}
			if a.seqs[i] > last[k] {
				last[k], lastID[k] = a.seqs[i], id
			}
		}
	}
	for k, id := range lastID {
		v, ok, err := s.dst.Get(ctx, k.target, "last/"+string(k.source))
		if err != nil || !ok || string(v) != id {
			t.Fatalf("%s last/%s = %q, want %q (seq %d): a row applied twice or out of order (seed %d)", k.target, k.source, v, id, last[k], seed)
		}
	}
	for _, r := range rs {
		t.Logf("%s: stats %+v", r.name, r.clock.Stats())
	}
	t.Logf("%d batches acknowledged, %d attempts refused during the restart", len(acks), retries)
}
