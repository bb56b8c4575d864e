//go:build unix

package bench

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"testing/synctest"
)

var latencyModel = flag.Bool("latency-model", false, "TestLatencyModel runs issue 25's workloads at full size (make bench) instead of a smoke run")

// TestLatencyModel is the latency benchmark's discrete-event model: the
// same cases (latencyCases) on the same emulated deployment, but
// in process (emudeploy.Config.InProcess: each function wired by
// lambda/env and its handler called directly, every endpoint in memory)
// inside a testing/synctest bubble, so time is virtual: it advances only
// when every goroutine waits for a modelled delay (a DynamoDB request, an
// API call, the async queue, a schedule's second, the producer's next
// tick), and the handlers' own CPU time counts as zero. Its figures are
// the model's, independent of the machine's load; BenchmarkLatency's are
// wall time on real processes, which adds the machine. Goroutines that
// become runnable at the same virtual instant still run in the
// scheduler's order, so two runs can differ by a request's latency here
// and there.
//
// Without -latency-model (make test) it runs every case at 2% of its size
// as a smoke run; `make bench` passes the flag and -v for the table.
// Nothing is asserted on time: a case fails only if a row is not
// delivered or a service contract is broken.
func TestLatencyModel(t *testing.T) {
	scale := 0.02
	if *latencyModel {
		scale = latencyScale(t)
	}
	tools := emuTools{inProcess: true}
	only := os.Getenv("RELAY_LATENCY_ONLY")
	var billed []outcome
	defer func() { writeDurations(t, "TestLatencyModel -latency-model (in process on virtual time)", billed) }()
	for _, c := range latencyCases(scale) {
		if only != "" && only != c.name {
			continue
		}
		for i, v := range c.vs {
			t.Run(c.name+"/"+v.name, func(t *testing.T) {
				var r outcome
				synctest.Test(t, func(t *testing.T) {
					var err error
					if r, err = runWorkload(tools, v, c.w, uint64(3000+i)); err != nil {
						t.Fatal(err)
					}
				})
				t.Log(describe(c, r))
				if v.billed {
					billed = append(billed, r)
				}
			})
		}
	}
}

// describe is one case's figures as the table in docs/benchmarks.md has
// them.
func describe(c latencyCase, r outcome) string {
	s := r.st
	if c.burst {
		return fmt.Sprintf("drain %.1f s (first enqueue to last apply; the last enqueue returned at %.1f s), %d rows, %d fire invocations, %d busy",
			r.last.Sub(r.start).Seconds(), r.enqueueEnd.Sub(r.start).Seconds(), r.rows, s.Fire.Invocations, s.FireBusy)
	}
	out := fmt.Sprintf("lag p50 %.2f s, p99 %.2f s, max %.2f s over %d rows", r.pct(0.5).Seconds(), r.pct(0.99).Seconds(), r.lags[len(r.lags)-1].Seconds(), r.rows)
	per := 1000 / float64(r.rows)
	out += fmt.Sprintf("; per 1000 rows: %.1f fire+sweep requests, %.1f Scheduler invocations, %.1f CreateSchedule, %.1f fast kicks (%.1f refused), %.1f busy, %.1f api requests",
		float64(s.Fire.Invocations+s.Sweep.Invocations)*per, float64(s.Scheduler.Runs+s.Sweep.Queued)*per,
		float64(s.Scheduler.Requests)*per, float64(s.Kicks.Accepted)*per, float64(s.Kicks.Refused)*per, float64(s.FireBusy)*per, float64(s.API.Invocations)*per)
	return out
}
