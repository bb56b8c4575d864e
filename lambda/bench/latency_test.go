//go:build unix

package bench

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/emudeploy"
)

// The latency benchmark runs the real bootstraps in an emulated deployment
// (lambda/emudeploy: the runtime emulator, Lambda's async queue and a
// bounded pool of fire environments, Scheduler's 60 s precision, the
// one-minute sweep, DynamoDB's single-digit-millisecond latency) on wall
// time, and measures how long a row takes from its enqueue request to its
// apply at the target, with today's Scheduler-only kick (FAST_KICK=false)
// and the fast kick (FAST_KICK=true) side by side in the same run.
//
// RELAY_LATENCY_SCALE (default 1) scales the workloads' durations and the
// burst's size, for a quicker look (0.25: a quarter); RELAY_LATENCY_ONLY
// (quiet, steady or burst) runs one workload.

// latencyScale reads RELAY_LATENCY_SCALE.
func latencyScale(tb testing.TB) float64 {
	v := os.Getenv("RELAY_LATENCY_SCALE")
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 10 {
		tb.Fatalf("RELAY_LATENCY_SCALE=%q: want a number in (0, 10]", v)
	}
	return f
}

// emuTools are the emulator and the bootstraps, built once per run.
type emuTools struct {
	rie  string
	bins map[string]string
}

func buildEmu(b *testing.B) emuTools {
	b.Helper()
	p := os.Getenv("RELAY_RIE")
	if p == "" {
		p = filepath.Join("..", "..", ".bin", "aws-lambda-rie")
	}
	if _, err := os.Stat(p); err != nil {
		b.Skipf("no aws-lambda-rie (%v): run `make tools` or set RELAY_RIE (make bench does)", err)
	}
	bins, err := emudeploy.Build(filepath.Join("..", ".."), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	return emuTools{rie: p, bins: bins}
}

// variant is one deployment setting under comparison.
type variant struct {
	name    string
	plan    string
	env     map[string]map[string]string
	refuse  bool // the api function's invokes refused (429)
	targets int
}

var (
	schedulerKick = variant{name: "scheduler", env: map[string]map[string]string{"api": {"FAST_KICK": "false"}}}
	fastKick      = variant{name: "fast", env: map[string]map[string]string{"api": {"FAST_KICK": "true"}}}
	refusedKick   = variant{name: "fast-refused", env: map[string]map[string]string{"api": {"FAST_KICK": "true"}}, refuse: true}
)

// outcome is one workload's result in one deployment.
type outcome struct {
	lags             []time.Duration // per row, sorted
	rows             int
	firstApply, last time.Time
	enqueueEnd       time.Time
	retried          int // enqueue requests retried after a 503
	st               emudeploy.Stats
	wall             time.Duration
}

func (r outcome) pct(p float64) time.Duration {
	if len(r.lags) == 0 {
		return 0
	}
	i := int(float64(len(r.lags))*p+0.999999) - 1
	return r.lags[min(max(i, 0), len(r.lags)-1)]
}

// workload sends requests on its own schedule: send is called with the
// next request's rows at each tick until the workload ends.
type workload struct {
	every    time.Duration
	duration time.Duration
	rowsPer  int
	targets  int
}

// runWorkload deploys v, plays w against it and waits for every row. It
// may run on any goroutine, so it returns its failure.
func runWorkload(tools emuTools, v variant, w workload, seed uint64) (outcome, error) {
	d, err := emudeploy.Start(emudeploy.Config{RIE: tools.rie, Bootstraps: tools.bins, Plan: v.plan, Env: v.env, Seed: seed})
	if err != nil {
		return outcome{}, fmt.Errorf("%s: %w", v.name, err)
	}
	defer d.Close()
	if v.refuse {
		d.RefuseKicks(429)
	}
	ctx := context.Background()
	val := base64.StdEncoding.EncodeToString([]byte(`{"total":1250,"currency":"EUR"}`))
	var (
		mu      sync.Mutex
		sent    = map[string]time.Time{}
		keys    []string
		wg      sync.WaitGroup
		failed  error
		retried int
	)
	n := 0
	tick := time.NewTicker(w.every)
	start := time.Now()
	for i := 0; time.Since(start) < w.duration; i++ {
		var rows []api.RowJSON
		var ks []string
		for range w.rowsPer {
			k := fmt.Sprintf("lag/%07d", n)
			rows = append(rows, api.RowJSON{Target: fmt.Sprintf("t%04d", n%w.targets), Puts: []api.PutJSON{{Key: k, Value: &val}}})
			ks = append(ks, k)
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := time.Now()
			// A 503 (contention, the enqueue deadline) is retried with the
			// same idempotency key, as a producer would; the lag counts
			// from the first attempt.
			key := fmt.Sprintf("req-%d", i)
			status, body, err := d.Enqueue(ctx, "orders", rows, key)
			retries := 0
			for ; err == nil && status == 503 && retries < 3; retries++ {
				status, body, err = d.Enqueue(ctx, "orders", rows, key)
			}
			mu.Lock()
			defer mu.Unlock()
			retried += retries
			if err == nil && status != 200 {
				err = fmt.Errorf("HTTP %d %s", status, body)
			}
			if err != nil {
				failed = err
				return
			}
			for _, k := range ks {
				sent[k] = at
			}
			keys = append(keys, ks...)
		}()
		<-tick.C
	}
	tick.Stop()
	wg.Wait()
	enqueueEnd := time.Now()
	if failed != nil {
		return outcome{}, fmt.Errorf("%s: enqueue: %w\n%s", v.name, failed, d.Logs())
	}
	// The lag bound is 60 s plus a sweep; a backlog that Scheduler alone
	// drains takes longer. 10 minutes means something is broken.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := d.WaitApplied(wctx, keys); err != nil {
		return outcome{}, fmt.Errorf("%s: %w\n%s", v.name, err, d.Logs())
	}
	if bad := d.Violations(); len(bad) != 0 {
		return outcome{}, fmt.Errorf("%s: contract violations: %q", v.name, bad)
	}
	r := outcome{rows: len(keys), st: d.Stats(), wall: time.Since(start), enqueueEnd: enqueueEnd, retried: retried}
	applied := d.Applied()
	for _, k := range keys {
		at := applied[k]
		r.lags = append(r.lags, at.Sub(sent[k]))
		if r.firstApply.IsZero() || at.Before(r.firstApply) {
			r.firstApply = at
		}
		if at.After(r.last) {
			r.last = at
		}
	}
	slices.Sort(r.lags)
	return r, nil
}

// runAll runs the variants' workloads at once (side by side: same
// machine, same moment) and returns their outcomes in order.
func runAll(b *testing.B, tools emuTools, w workload, vs ...variant) []outcome {
	b.Helper()
	out := make([]outcome, len(vs))
	errs := make([]error, len(vs))
	var wg sync.WaitGroup
	for i, v := range vs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = runWorkload(tools, v, w, uint64(1000+i))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func reportLag(b *testing.B, r outcome) {
	b.ReportMetric(r.pct(0.50).Seconds(), "lag_p50_s")
	b.ReportMetric(r.pct(0.99).Seconds(), "lag_p99_s")
	b.ReportMetric(r.lags[len(r.lags)-1].Seconds(), "lag_max_s")
	b.ReportMetric(float64(r.rows), "rows")
	b.ReportMetric(float64(r.retried), "enqueue_retries")
	b.ReportMetric(0, "ns/op") // wall time of the whole run is not the figure
}

// reportCost reports, per 1,000 delivered rows, what the kicks and the
// deliveries cost in AWS's billing units: Lambda requests of the fire and
// sweep functions (every invocation, busy ones included), Scheduler
// invocations (one-time schedules that ran plus the sweep's ticks) and
// CreateSchedule calls. The api function's requests are the producer's
// and the same in every variant; they are reported apart.
func reportCost(b *testing.B, r outcome) {
	per := 1000 / float64(r.rows)
	s := r.st
	lambdaReq := float64(s.Fire.Invocations + s.Sweep.Invocations)
	schedInv := float64(s.Scheduler.Runs + s.Sweep.Queued)
	b.ReportMetric(lambdaReq*per, "lambda_req/krow")
	b.ReportMetric(schedInv*per, "sched_inv/krow")
	b.ReportMetric((lambdaReq+schedInv)*per, "lambda+sched/krow")
	b.ReportMetric(float64(s.Scheduler.Requests)*per, "create_schedule/krow")
	b.ReportMetric(float64(s.API.Invocations)*per, "api_req/krow")
	b.ReportMetric(float64(s.Kicks.Accepted)*per, "fast_kicks/krow")
	b.ReportMetric(float64(s.FireBusy)*per, "busy/krow")
}

// BenchmarkLatency: enqueue-to-apply lag and drain time in the emulated
// deployment (docs/benchmarks.md, "Serverless relay: latency"; the goals
// are issue 25's). Several minutes of wall time.
func BenchmarkLatency(b *testing.B) {
	scale := latencyScale(b)
	tools := buildEmu(b)
	dur := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }

	only := os.Getenv("RELAY_LATENCY_ONLY")
	want := func(w string) bool { return only == "" || only == w }

	// Quiet source: 1 row every 5 s for 2 minutes (Free, the template's
	// default plan), the kicks side by side with every fast invoke refused.
	if want("quiet") {
		quiet := runAll(b, tools, workload{every: 5 * time.Second, duration: dur(2 * time.Minute), rowsPer: 1, targets: 1},
			schedulerKick, fastKick, refusedKick)
		for i, v := range []variant{schedulerKick, fastKick, refusedKick} {
			b.Run("quiet/"+v.name, func(b *testing.B) { reportLag(b, quiet[i]) })
		}
	}

	// Steady source: 200 rows/s for a minute into 16 targets, as 20-row
	// requests every 100 ms.
	if want("steady") {
		steady := runAll(b, tools, workload{every: 100 * time.Millisecond, duration: dur(time.Minute), rowsPer: 20, targets: 16},
			schedulerKick, fastKick)
		for i, v := range []variant{schedulerKick, fastKick} {
			b.Run("steady/"+v.name, func(b *testing.B) { reportLag(b, steady[i]); reportCost(b, steady[i]) })
		}
	}
	if !want("burst") {
		return
	}

	// Burst: 10,000 rows into 1,000 targets (10 requests of 1,000 rows),
	// Paid, delivered one target at a time and at the default
	// concurrency; one after the other, so the two do not share the CPU.
	targets := max(int(1000*scale), 10)
	burst := workload{every: 200 * time.Millisecond, duration: 10 * 200 * time.Millisecond, rowsPer: targets, targets: targets}
	for _, c := range []struct{ name, conc string }{{"sequential", "1"}, {"concurrent", ""}} {
		v := fastKick
		v.name, v.plan = "burst-"+c.name, "paid"
		v.env = map[string]map[string]string{"api": {"FAST_KICK": "true"}}
		if c.conc != "" {
			v.env["fire"] = map[string]string{"DELIVER_CONCURRENCY": c.conc}
		}
		r, err := runWorkload(tools, v, burst, 2000)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("burst/"+c.name, func(b *testing.B) {
			b.ReportMetric(r.last.Sub(r.firstApply).Seconds(), "drain_s")
			b.ReportMetric(r.last.Sub(r.enqueueEnd).Seconds(), "enqueued_to_drained_s")
			b.ReportMetric(float64(r.rows), "rows")
			b.ReportMetric(float64(r.st.Fire.Invocations), "fire_invocations")
			b.ReportMetric(0, "ns/op")
		})
	}
}
