package alarmclock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// BenchmarkReplicas measures delivered rows/s with one replica's clock and
// with three on one PostgreSQL store (the test cluster: Unix socket,
// fsync and synchronous_commit off), the same load, interleaved round by
// round so machine noise hits both alike: 8 producers, each on its own
// pair of the 16 sources, enqueue 200 batches of 20 rows (200-byte values,
// 8 targets per source), producer p through replica p mod 3 (the affinity
// of a load balancer, which docs/serve.md recommends), and the clock stops
// when every outbox is empty. Plan paid, 4 alarm workers per replica, each
// replica with a pool of 8 connections. Reported: rows/s of each, their
// ratio (three / one), and for three replicas the busy alarms and the
// checks that left a source to another replica, per 1,000 alarms, and the
// smallest share of the alarms one replica ran.
//
// Three replicas in one process share its cores, so they run three times
// the alarm workers of one on the same CPU. A third configuration, one
// replica with 12 workers, has their concurrency without their fighting:
// three / one-12 isolates what the replicas cost one another (duplicate
// fires, claims met, checks), three / one adds what the extra concurrency
// costs on a saturated machine. Each configuration runs twice, with
// fires back to back (alarms.linger 0, relay serve's default) and with
// alarms.linger 2 (suffix -linger); one more, 3-spread-linger, sends each
// producer's batches through the three replicas in turn (no affinity: a
// source's enqueues and fires on all of them). Per configuration it also
// reports CPU per delivered row (the relay's, this process's with the
// producers; the server's sessions'), rows and fires per alarm and store
// calls (each one PostgreSQL transaction) per delivered row, source and
// target stores apart: a replica that did another's work would show as
// more calls per row at the same rows per alarm.
//
// 200 batches a producer (32,000 rows, a second or two a round) rather
// than fewer: a round of half a second is mostly its start and its end
// (the first fires, the last ones), not the steady state.
func BenchmarkReplicas(b *testing.B) {
	const (
		producers, sourcesPer, batches, perBatch, targets = 8, 2, 200, 20, 8
		valueSize                                         = 200
	)
	budget, err := relaycore.PlanBudget("paid")
	if err != nil {
		b.Fatal(err)
	}
	dsn := pgtest.NewDatabase(b)
	pgCfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	dbName := pgCfg.Database
	value := make([]byte, valueSize)
	configs := []struct {
		name              string
		replicas, workers int
		conns             int     // per replica
		linger            float64 // alarmclock.Config.Linger
		// spread: each producer's batches go to the replicas in turn;
		// otherwise producer p writes through replica p%n (a load
		// balancer's affinity, docs/serve.md).
		spread       bool
		elapsed      time.Duration
		alarms       atomic.Int64
		empty        atomic.Int64 // alarms that delivered nothing
		fires        atomic.Int64
		srcCalls     int64
		dstCalls     int64
		goCPU, pgCPU time.Duration // relay's (this process's, producers' included) and the server's
	}{
		{name: "1", replicas: 1, workers: 4, conns: 8},
		{name: "3", replicas: 3, workers: 4, conns: 8},
		{name: "1x12", replicas: 1, workers: 12, conns: 24},
		{name: "1-linger", replicas: 1, workers: 4, conns: 8, linger: 2},
		{name: "3-linger", replicas: 3, workers: 4, conns: 8, linger: 2},
		{name: "1x12-linger", replicas: 1, workers: 12, conns: 24, linger: 2},
		{name: "3-spread-linger", replicas: 3, workers: 4, conns: 8, linger: 2, spread: true},
	}
	var alarms, busy, skipped int64
	minShare := 1.0
	run := func(ci, round int) time.Duration {
		cfg := &configs[ci]
		n := cfg.replicas
		goCPU0 := processCPU(b)
		var opened []*pgxpool.Pool
		defer func() {
			// The run's sessions are the database's live ones (the
			// previous runs' pools are closed); then close them, at the
			// run's end rather than the benchmark's: six
			// configurations' pools at once exceed the cluster's clients.
			cfg.goCPU += processCPU(b) - goCPU0
			cfg.pgCPU += sessionsCPU(b, dbName)
			for _, p := range opened {
				p.Close()
			}
		}()
		pools := make([]*postgres.DB, n)
		for i := range pools {
			pool := pgtest.Pool(b, dsn, cfg.conns)
			opened = append(opened, pool)
			db, err := postgres.Open(b.Context(), pool, postgres.Options{})
			if err != nil {
				b.Fatal(err)
			}
			pools[i] = db
		}
		srcName, dstName := fmt.Sprintf("src-%s-%d", cfg.name, round), fmt.Sprintf("dst-%s-%d", cfg.name, round)
		observed := make(chan struct{}, 1)
		var rs []*replica
		var counters []*relaycore.CountingStore // source, target of each replica
		for i := range n {
			src, dst := relaycore.NewCountingStore(pools[i].Store(srcName)), relaycore.NewCountingStore(pools[i].Store(dstName))
			counters = append(counters, src, dst)
			s := shared{src, dst, src}
			r := newReplicasTTL(s, 1, relaycore.SystemClock{}, time.Minute, claimTTL, nil, observed)[0]
			r.name = fmt.Sprintf("r%d", i)
			r.h.Budget = budget
			r.h.DeliverConcurrency = 8
			r.clock = alarmclock.New(alarmclock.Config{Handler: r.h, Index: s.index, Source: s.src, Replica: r.name, Workers: cfg.workers, Linger: cfg.linger,
				Observe: func(_ relaycore.Partition, res relaycore.AlarmResult, _ error) {
					cfg.alarms.Add(1)
					cfg.fires.Add(int64(res.Fires))
					if res.RowsDelivered == 0 {
						cfg.empty.Add(1)
					}
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
					via := p % n
					if cfg.spread {
						via = (p + j) % n
					}
					if _, err := rs[via].h.Enqueue(ctx, src, rows, relaycore.EnqueueOptions{}); err != nil {
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
		// The drain check's own reads went through replica 0's source
		// store: counted, but a few per alarm at most, in every
		// configuration alike.
		for i, c := range counters {
			k := c.Snapshot()
			calls := k.Gets + k.GetManys + k.Scans + k.Applies + k.DueReads
			if i%2 == 0 {
				cfg.srcCalls += calls
			} else {
				cfg.dstCalls += calls
			}
		}
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
		for ci := range configs {
			configs[ci].elapsed += run(ci, round)
		}
	}
	rows := float64(b.N * producers * batches * perBatch)
	rate := func(ci int) float64 { return rows / configs[ci].elapsed.Seconds() }
	for i := range configs {
		b.ReportMetric(rate(i), "rows/s-"+configs[i].name)
	}
	b.ReportMetric(rate(1)/rate(0), "three/one")
	b.ReportMetric(rate(1)/rate(2), "three/one-12")
	b.ReportMetric(rate(4)/rate(3), "three/one-linger")
	b.ReportMetric(rate(4)/rate(5), "three/one-12-linger")
	b.ReportMetric(rate(3)/rate(0), "linger/eager-1")
	b.ReportMetric(rate(4)/rate(1), "linger/eager-3")
	b.ReportMetric(rate(6)/rate(3), "three-spread/one-linger")
	b.ReportMetric(float64(busy)*1000/float64(max(alarms, 1)), "busy/1k-alarms")
	b.ReportMetric(float64(skipped)*1000/float64(max(alarms, 1)), "left/1k-alarms")
	b.ReportMetric(minShare, "min-share")
	for i := range configs {
		c := &configs[i]
		b.ReportMetric(rows/float64(max(c.alarms.Load(), 1)), "rows/alarm-"+c.name)
		b.ReportMetric(float64(c.fires.Load())/float64(max(c.alarms.Load(), 1)), "fires/alarm-"+c.name)
		b.ReportMetric(float64(c.empty.Load())*1000/float64(max(c.alarms.Load(), 1)), "empty/1k-alarms-"+c.name)
		b.ReportMetric(float64(c.srcCalls)/rows, "src-calls/row-"+c.name)
		b.ReportMetric(float64(c.dstCalls)/rows, "dst-calls/row-"+c.name)
		b.ReportMetric(float64(c.goCPU.Microseconds())/rows, "relay-cpu-us/row-"+c.name)
		b.ReportMetric(float64(c.pgCPU.Microseconds())/rows, "pg-cpu-us/row-"+c.name)
	}
}

// processCPU is this process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sessionsCPU is the CPU time of the test cluster's sessions on db
// (pgtest.Cluster.BackendCPU).
func sessionsCPU(b *testing.B, db string) time.Duration {
	d, err := pgtest.Get(b).BackendCPU(db)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
