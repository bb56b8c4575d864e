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

// BenchmarkReplicas measures delivered rows/s with one replica's clock and
// with three on one PostgreSQL store (the test cluster: Unix socket,
// fsync and synchronous_commit off), the same load, interleaved round by
// round so machine noise hits both alike: 8 producers, each on its own
// pair of the 16 sources, enqueue 50 batches of 20 rows (200-byte values,
// 8 targets per source) through the replicas in turn, and the clock stops
// when every outbox is empty. Plan paid, 4 alarm workers per replica, each
// replica with a pool of 8 connections. Reported: rows/s of each, their
// ratio (three / one: >= 1 means no fighting), and for three replicas the
// busy alarms and the checks that left a source to another replica, per
// 1,000 alarms, and the smallest share of the alarms one replica ran.
func BenchmarkReplicas(b *testing.B) {
	const (
		producers, sourcesPer, batches, perBatch, targets = 8, 2, 50, 20, 8
		valueSize                                         = 200
	)
	budget, err := relaycore.PlanBudget("paid")
	if err != nil {
		b.Fatal(err)
	}
	dsn := pgtest.NewDatabase(b)
	value := make([]byte, valueSize)
	var elapsed [2]time.Duration
	var alarms, busy, skipped int64
	minShare := 1.0
	run := func(n, round int) time.Duration {
		pools := make([]*postgres.DB, n)
		for i := range pools {
			db, err := postgres.Open(b.Context(), pgtest.Pool(b, dsn, 8), postgres.Options{})
			if err != nil {
				b.Fatal(err)
			}
			pools[i] = db
		}
		srcName, dstName := fmt.Sprintf("src-%d-%d", n, round), fmt.Sprintf("dst-%d-%d", n, round)
		observed := make(chan struct{}, 1)
		var rs []*replica
		for i := range n {
			s := shared{pools[i].Store(srcName), pools[i].Store(dstName), pools[i].Store(srcName)}
			r := newReplicasTTL(s, 1, relaycore.SystemClock{}, time.Minute, claimTTL, nil, observed)[0]
			r.name = fmt.Sprintf("r%d", i)
			r.h.Budget = budget
			r.h.DeliverConcurrency = 8
			r.clock = alarmclock.New(alarmclock.Config{Handler: r.h, Index: s.index, Source: s.src, Replica: r.name,
				Observe: func(relaycore.Partition, relaycore.AlarmResult, error) {
					select {
					case observed <- struct{}{}:
					default:
					}
				}})
			r.h.Kicker = r.clock
			rs = append(rs, r)
		}
		ctx, cancel := context.WithCancel(b.Context())
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Go(func() { r.clock.Run(ctx) })
		}
		start := time.Now()
		var pw sync.WaitGroup
		for p := range producers {
			pw.Go(func() {
				for j := range batches {
					src := relaycore.Partition(fmt.Sprintf("s%02d", p*sourcesPer+j%sourcesPer))
					rows := make([]relaycore.Row, perBatch)
					for i := range rows {
						rows[i] = relaycore.Row{Target: relaycore.Partition(fmt.Sprintf("%s.t%d", src, i%targets)),
							Puts: []relaycore.KV{{Key: fmt.Sprintf("p%d-%d-%d", p, j, i), Value: value}}}
					}
					if _, err := rs[(p+j)%n].h.Enqueue(ctx, src, rows, relaycore.EnqueueOptions{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		pw.Wait()
		src := rs[0].h.Source
		for drained := false; !drained; {
			drained = true
			for i := range producers * sourcesPer {
				st, err := relaycore.SourceRelayState(ctx, src, relaycore.Partition(fmt.Sprintf("s%02d", i)), time.Now())
				if err != nil {
					b.Fatal(err)
				}
				drained = drained && st.Empty
			}
			if !drained {
				<-observed
			}
		}
		d := time.Since(start)
		cancel()
		wg.Wait()
		if n > 1 {
			var total int64
			var least int64 = -1
			for _, r := range rs {
				st := r.clock.Stats()
				total += st.Alarms
				busy += st.Busy
				skipped += st.SkippedDone + st.SkippedClaimed
				if least < 0 || st.Alarms < least {
					least = st.Alarms
				}
			}
			alarms += total
			minShare = min(minShare, float64(least)/float64(total))
		}
		return d
	}
	for round := range b.N {
		elapsed[0] += run(1, round)
		elapsed[1] += run(3, round)
	}
	rows := float64(b.N * producers * batches * perBatch)
	one, three := rows/elapsed[0].Seconds(), rows/elapsed[1].Seconds()
	b.ReportMetric(one, "rows/s-1")
	b.ReportMetric(three, "rows/s-3")
	b.ReportMetric(three/one, "three/one")
	b.ReportMetric(float64(busy)*1000/float64(max(alarms, 1)), "busy/1k-alarms")
	b.ReportMetric(float64(skipped)*1000/float64(max(alarms, 1)), "left/1k-alarms")
	b.ReportMetric(minShare, "min-share")
}
