package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/infra/scheduler/schedulertest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// simClock is the simulated time: it moves when the driver runs a schedule
// at its at() time and, while an invocation runs, by the latency of the
// requests it has made so far (elapsed), so a re-arm kicked at the end of a
// long alarm is due after that alarm, as it would be on AWS.
type simClock struct {
	mu      sync.Mutex
	now     time.Time
	elapsed func() time.Duration // nil between invocations
}

func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.elapsed != nil {
		return c.now.Add(c.elapsed())
	}
	return c.now
}

// during makes Now include elapsed until the returned func is called.
func (c *simClock) during(elapsed func() time.Duration) (end func()) {
	c.mu.Lock()
	c.elapsed = elapsed
	c.mu.Unlock()
	return func() { c.mu.Lock(); c.elapsed = nil; c.mu.Unlock() }
}

func (c *simClock) AdvanceTo(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

// The simulated clock advances by a latency model, not by wall time (on an
// emulator wall time says nothing about AWS). These are assumptions, stated
// so the figures can be re-derived: an in-region DynamoDB request takes
// about 8 ms, a Scheduler or Lambda API request about 30 ms, and Lambda's
// async queue starts an accepted invocation about 100 ms later. An
// invocation lasts as long as the requests it makes, in sequence.
const (
	ddbLatency  = 8 * time.Millisecond
	apiLatency  = 30 * time.Millisecond
	asyncLaunch = 100 * time.Millisecond
)

const fireARN = "arn:aws:lambda:us-east-1:123456789012:function:relay-fire"

// backlog is a workload: rowsPerTarget rows for each of targets targets,
// enqueued through the api function in requests of at most perRequest rows.
type backlog struct {
	plan                   string
	targets, rowsPerTarget int
	valueBytes             int
	perRequest             int
}

func (b backlog) rows() int { return b.targets * b.rowsPerTarget }

// figures is what one drain cost.
type figures struct {
	rows          int
	hops          int // the fire handler's MaxHops (0: no continuation)
	alarms        int // fire invocations that ran an alarm
	productive    int // alarms that delivered or cleaned rows
	apiCalls      int // api invocations
	busy          int // fire invocations that found another fire at work
	continuations int // async self-invocations accepted by Lambda
	maxHop        int // the largest hop a fire invocation carried
	schedCalls    int // CreateSchedule requests (including conflicts)
	schedCreated  int
	schedRuns     int           // schedules that ran (each one fire invocation)
	fireTime      time.Duration // simulated time spent in alarms, in total
	ddbCalls      int64         // GetItem + Query + Scan + TransactWriteItems attempts
	ddbDelivery   int64         // the same, during the drain only
	writeUnits    int64         // table + index write units
	readUnits     float64
	simDrain      time.Duration // simulated time from the first kick to empty
	bound         int
	budgetPerAlrm int // targets per alarm
}

const source = relaycore.Partition("orders")

// run enqueues b through the api handler and drains it by running armed
// schedules and continuations through the fire handler, on fresh tables,
// with the fire handler continuing up to hops times per kick.
func run(tb testing.TB, b backlog, hops int) figures {
	tb.Helper()
	ctx := context.Background()
	budget, err := relaycore.PlanBudget(b.plan)
	if err != nil {
		tb.Fatal(err)
	}
	ddb := dynamotest.Start(tb)
	client := ddb.Client(nil) // dynamotest sets X-Amz-Crc32, so the SDK validates every response
	for _, tbl := range []string{"relay-source", "relay-target"} {
		if err := dynamo.CreateTable(ctx, client, tbl); err != nil {
			tb.Fatal(err)
		}
	}
	src := dynamo.New(client, "relay-source", dynamo.Options{})
	tgt := dynamo.New(client, "relay-target", dynamo.Options{})
	sched := schedulertest.Start(tb)
	clock := &simClock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	kicker, err := scheduler.New(scheduler.Config{
		Client: sched.Client(), Group: "relay-alarms",
		TargetARN: fireARN,
		RoleARN:   "arn:aws:iam::123456789012:role/relay-scheduler",
		Now:       clock.Now,
	})
	if err != nil {
		tb.Fatal(err)
	}
	apiH := &api.Handler{Source: src, Clock: clock, Relay: &relaycore.RelayHandler{Source: src, Target: tgt, Clock: clock, Kicker: kicker}}
	lam := invoketest.Start(tb, fireARN)
	invoker, err := lambdainvoke.New(lambdainvoke.Config{Client: lam.Client(), FunctionARN: fireARN})
	if err != nil {
		tb.Fatal(err)
	}
	fireH := &fire.Handler{
		Relay:    &relaycore.RelayHandler{Source: src, Target: tgt, Budget: budget, Clock: clock, Kicker: kicker},
		Continue: invoker, MaxHops: hops, Clock: clock,
	}

	f := figures{rows: b.rows(), hops: hops, budgetPerAlrm: budget.TargetsPerFire * budget.FiresPerAlarm}
	f.bound = (b.targets+f.budgetPerAlrm-1)/f.budgetPerAlrm + 64

	// Enqueue: rows interleaved across targets, as producers would send them.
	value := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("v"), b.valueBytes))
	var batch []api.RowJSON
	flush := func() {
		if len(batch) == 0 {
			return
		}
		body, err := json.Marshal(api.EnqueueRequest{Rows: batch})
		if err != nil {
			tb.Fatal(err)
		}
		req := events.LambdaFunctionURLRequest{Version: "2.0", RawPath: "/v1/sources/" + string(source) + "/rows", Body: string(body),
			Headers: map[string]string{"content-type": "application/json"}}
		req.RequestContext.HTTP.Method = "POST"
		req.RequestContext.Authorizer = &events.LambdaFunctionURLRequestContextAuthorizerDescription{
			IAM: &events.LambdaFunctionURLRequestContextAuthorizerIAMDescription{UserARN: "arn:aws:sts::123456789012:assumed-role/producer/bench"}}
		payload, _ := json.Marshal(req)
		resp, err := apiH.Handle(ctx, payload)
		if err != nil || resp.StatusCode != 200 {
			tb.Fatalf("enqueue: %d %s %v", resp.StatusCode, resp.Body, err)
		}
		f.apiCalls++
		batch = batch[:0]
	}
	for r := range b.rowsPerTarget {
		for t := range b.targets {
			v := value
			batch = append(batch, api.RowJSON{Target: fmt.Sprintf("t%05d", t), Puts: []api.PutJSON{{Key: fmt.Sprintf("k/%d", r), Value: &v}}})
			if len(batch) == b.perRequest {
				flush()
			}
		}
	}
	flush()
	enqueueCalls := ddbCalls(src, tgt)

	// Drain: play Scheduler and Lambda's async queue on the simulated
	// clock, running each armed schedule at its at() time and each
	// accepted continuation asyncLaunch after the invocation that sent it
	// ended. One source runs one alarm at a time: an invocation arriving
	// while another alarm runs finds the engine's claim and steps aside
	// (Busy: no delivery, no re-arm, no continuation); the driver counts it
	// without running it, because in-process runs do not overlap.
	start := clock.Now()
	end := start
	var busyUntil time.Time
	type queued struct {
		at      time.Time
		payload []byte
	}
	var conts []queued
	invoke := func(at time.Time, payload []byte) {
		if at.Before(busyUntil) {
			f.busy++
			return
		}
		clock.AdvanceTo(at)
		before := requests(src, tgt, sched, lam)
		endRun := clock.during(func() time.Duration { return requests(src, tgt, sched, lam).since(before) })
		res, err := fireH.Handle(ctx, payload)
		endRun()
		if err != nil {
			tb.Fatalf("alarm %d: %v", f.alarms+1, err)
		}
		f.alarms++
		if res.RowsDelivered > 0 || res.RowsCleaned > 0 {
			f.productive++
		}
		f.maxHop = max(f.maxHop, res.Hop)
		took := requests(src, tgt, sched, lam).since(before)
		f.fireTime += took
		busyUntil = at.Add(took)
		end = busyUntil
		if res.Continued {
			inv := <-lam.C // accepted before Handle returned
			conts = append(conts, queued{at: busyUntil.Add(asyncLaunch), payload: inv.Payload})
		}
	}
	for f.alarms+f.busy < 100*f.bound {
		pending := sched.Pending()
		switch {
		case len(conts) > 0 && (len(pending) == 0 || !pending[0].At.Before(conts[0].at)):
			c := conts[0]
			conts = conts[1:]
			invoke(c.at, c.payload)
		case len(pending) > 0:
			at := pending[0].At
			for _, due := range sched.TakeDue(at) {
				if due.Input != string(firstEvent(source)) {
					tb.Fatalf("schedule input %s", due.Input)
				}
				f.schedRuns++
				invoke(at, []byte(due.Input))
			}
		}
		if len(conts) == 0 && len(sched.Pending()) == 0 {
			break
		}
	}
	clock.AdvanceTo(end)
	f.continuations = len(lam.Accepted())
	f.simDrain = clock.Now().Sub(start)
	done, err := relaycore.RelayDeliveredThrough(ctx, src, source, uint64(b.rows()))
	if err != nil || !done {
		tb.Fatalf("backlog not drained after %d alarms (%v)", f.alarms, err)
	}
	st := sched.Stats()
	f.schedCalls, f.schedCreated = st.Requests, st.Created
	f.ddbCalls = ddbCalls(src, tgt)
	f.ddbDelivery = f.ddbCalls - enqueueCalls
	for _, s := range []dynamo.Stats{src.Stats(), tgt.Stats()} {
		f.writeUnits += s.WriteUnits + s.IndexWriteUnits
		f.readUnits += s.ReadUnits
	}
	return f
}

func firstEvent(src relaycore.Partition) []byte { return []byte(`{"source":"` + string(src) + `"}`) }

// counts is a snapshot of the requests the fire handler can make.
type counts struct{ ddb, api int64 }

func requests(src, tgt *dynamo.Store, sched *schedulertest.Server, lam *invoketest.Server) counts {
	return counts{ddb: ddbCalls(src, tgt), api: int64(sched.Stats().Requests + lam.Stats().Requests)}
}

// since is the simulated time the requests made after before took.
func (c counts) since(before counts) time.Duration {
	return time.Duration(c.ddb-before.ddb)*ddbLatency + time.Duration(c.api-before.api)*apiLatency
}

func ddbCalls(stores ...*dynamo.Store) int64 {
	var n int64
	for _, s := range stores {
		st := s.Stats()
		n += st.GetItem + st.Query + st.Scan + st.TransactWriteItems
	}
	return n
}

// shapes are the benchmarked backlogs: wide (4096 targets × 1 row, the
// design's drain regression) and deep (16 targets × 256 rows).
func shapes(plan string) map[string]backlog {
	return map[string]backlog{
		"wide4096": {plan: plan, targets: 4096, rowsPerTarget: 1, valueBytes: 64, perRequest: 1000},
		"deep16":   {plan: plan, targets: 16, rowsPerTarget: 256, valueBytes: 64, perRequest: 1000},
	}
}

func BenchmarkBacklog(b *testing.B) {
	for _, plan := range []string{"free", "paid"} {
		for _, name := range []string{"wide4096", "deep16"} {
			for _, hops := range []int{0, fire.DefaultMaxHops} {
				bl := shapes(plan)[name]
				b.Run(fmt.Sprintf("%s/%s/hops%d", plan, name, hops), func(b *testing.B) {
					var f figures
					for range b.N {
						f = run(b, bl, hops)
					}
					if bl.targets == 4096 && f.alarms > f.bound {
						b.Errorf("%d alarms to drain 4096 targets, bound %d", f.alarms, f.bound)
					}
					rows := float64(f.rows)
					b.ReportMetric(float64(f.alarms), "alarms")
					b.ReportMetric(float64(f.bound), "alarm_bound")
					b.ReportMetric(float64(f.busy), "busy")
					b.ReportMetric(float64(f.continuations), "continuations")
					b.ReportMetric(float64(f.alarms+f.busy+f.apiCalls), "lambda_invocations")
					b.ReportMetric(float64(f.schedCalls), "scheduler_calls")
					b.ReportMetric(float64(f.schedRuns), "scheduler_runs")
					b.ReportMetric(float64(f.ddbCalls)/rows, "ddb_calls/row")
					b.ReportMetric(float64(f.ddbDelivery)/rows, "ddb_delivery_calls/row")
					b.ReportMetric(float64(f.writeUnits)/rows, "wru/row")
					b.ReportMetric(f.readUnits/rows, "rru/row")
					b.ReportMetric(f.fireTime.Seconds()/float64(f.alarms), "alarm_s")
					b.ReportMetric(f.simDrain.Seconds(), "sim_drain_s")
					b.ReportMetric(0, "ns/op") // wall time on an emulator says nothing about AWS
				})
			}
		}
	}
}

// TestDrainWithinBound runs a small backlog per plan through the same
// driver, without and with continuation, so `make test` keeps the
// benchmark honest: everything is delivered within the alarm bound;
// without continuation every alarm re-arms exactly one schedule and none
// overlaps another; with it, every continuation comes from an alarm that
// ran, no hop exceeds the bound, and the drain is shorter.
func TestDrainWithinBound(t *testing.T) {
	for _, plan := range []string{"free", "paid"} {
		t.Run(plan, func(t *testing.T) {
			bl := backlog{plan: plan, targets: 300, rowsPerTarget: 1, valueBytes: 16, perRequest: 128}
			var drains [2]time.Duration
			for i, hops := range []int{0, fire.DefaultMaxHops} {
				f := run(t, bl, hops)
				drains[i] = f.simDrain
				want := (bl.targets + f.budgetPerAlrm - 1) / f.budgetPerAlrm
				if f.alarms < want || f.alarms > f.bound {
					t.Errorf("hops %d: %d alarms, want between %d and the bound %d", hops, f.alarms, want, f.bound)
				}
				if f.apiCalls != 3 {
					t.Errorf("hops %d: %d api calls, want 3", hops, f.apiCalls)
				}
				// A continuation comes only from an alarm that moved rows, so
				// a chain can never outlast the backlog.
				if f.maxHop > hops || f.continuations > f.productive {
					t.Errorf("hops %d: max hop %d, %d continuations for %d alarms that moved rows", hops, f.maxHop, f.continuations, f.productive)
				}
				if hops == 0 {
					if f.busy != 0 || f.continuations != 0 {
						t.Errorf("without continuation: %d busy, %d continuations, want none", f.busy, f.continuations)
					}
					// One schedule per enqueue-kick second plus one per re-arm.
					if f.schedCreated != f.alarms {
						t.Errorf("%d schedules created for %d alarms", f.schedCreated, f.alarms)
					}
				} else if want > 1 && f.continuations == 0 {
					t.Errorf("a backlog of %d alarms drained without continuations", want)
				}
				t.Logf("%s hops %d: %+v", plan, hops, f)
			}
			if want := (bl.targets + 15) / 16; plan == "free" && want > 1 && drains[1] >= drains[0] {
				t.Errorf("continuation did not shorten the drain: %s with, %s without", drains[1], drains[0])
			}
		})
	}
}
