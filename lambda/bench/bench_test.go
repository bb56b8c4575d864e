package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/schedulertest"
	"github.com/relay-dev/relay/relaycore"
)

// simClock is the simulated time: it moves only when the driver runs a
// schedule at its at() time.
type simClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *simClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *simClock) AdvanceTo(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

// crcTransport adds the X-Amz-Crc32 header DynamoDB sends and minidyn
// does not, so the SDK's checksum validation is exercised (and quiet).
type crcTransport struct{}

func (crcTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	return resp, nil
}

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
	alarms        int // fire invocations (scheduled runs)
	apiCalls      int // api invocations
	busy          int // alarms that found another fire at work
	schedCalls    int // CreateSchedule requests (including conflicts)
	schedCreated  int
	ddbCalls      int64 // GetItem + Query + Scan + TransactWriteItems attempts
	ddbDelivery   int64 // the same, during the drain only
	writeUnits    int64 // table + index write units
	readUnits     float64
	simDrain      time.Duration // simulated time from the first kick to empty
	bound         int
	budgetPerAlrm int // targets per alarm
}

const source = relaycore.Partition("orders")

// run enqueues b through the api handler and drains it by running armed
// schedules through the fire handler, on fresh tables.
func run(tb testing.TB, b backlog) figures {
	tb.Helper()
	ctx := context.Background()
	budget, err := relaycore.PlanBudget(b.plan)
	if err != nil {
		tb.Fatal(err)
	}
	ddb := dynamotest.Start(tb)
	client := ddb.Client(crcTransport{})
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
		TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:relay-fire",
		RoleARN:   "arn:aws:iam::123456789012:role/relay-scheduler",
		Now:       clock.Now,
	})
	if err != nil {
		tb.Fatal(err)
	}
	apiH := &api.Handler{Source: src, Clock: clock, Enqueue: relaycore.EnqueueConfig{Kicker: kicker, TargetCaps: tgt.Capabilities()}}
	fireH := &fire.Handler{Relay: &relaycore.RelayHandler{Source: src, Target: tgt, Budget: budget, Clock: clock, Kicker: kicker}}

	f := figures{rows: b.rows(), budgetPerAlrm: budget.TargetsPerFire * budget.FiresPerAlarm}
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

	// Drain: run schedules in at() order on the simulated clock.
	start := clock.Now()
	firstEvent := []byte(`{"source":"` + string(source) + `"}`)
	for f.alarms < 100*f.bound {
		pending := sched.Pending()
		if len(pending) == 0 {
			break
		}
		sc := pending[0]
		clock.AdvanceTo(sc.At)
		for _, due := range sched.TakeDue(sc.At) {
			if due.Input != string(firstEvent) {
				tb.Fatalf("schedule input %s", due.Input)
			}
			res, err := fireH.Handle(ctx, []byte(due.Input))
			if err != nil {
				tb.Fatalf("alarm %d: %v", f.alarms+1, err)
			}
			f.alarms++
			if res.Busy {
				f.busy++
			}
		}
	}
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
			bl := shapes(plan)[name]
			b.Run(plan+"/"+name, func(b *testing.B) {
				var f figures
				for range b.N {
					f = run(b, bl)
				}
				if bl.targets == 4096 && f.alarms > f.bound {
					b.Errorf("%d alarms to drain 4096 targets, bound %d", f.alarms, f.bound)
				}
				rows := float64(f.rows)
				b.ReportMetric(float64(f.alarms), "alarms")
				b.ReportMetric(float64(f.bound), "alarm_bound")
				b.ReportMetric(float64(f.alarms+f.apiCalls), "lambda_invocations")
				b.ReportMetric(float64(f.schedCalls), "scheduler_calls")
				b.ReportMetric(float64(f.ddbCalls)/rows, "ddb_calls/row")
				b.ReportMetric(float64(f.ddbDelivery)/rows, "ddb_delivery_calls/row")
				b.ReportMetric(float64(f.writeUnits)/rows, "wru/row")
				b.ReportMetric(f.readUnits/rows, "rru/row")
				b.ReportMetric(f.simDrain.Seconds(), "sim_drain_s")
				b.ReportMetric(0, "ns/op") // wall time on an emulator says nothing about AWS
			})
		}
	}
}

// TestDrainWithinBound runs a small backlog per plan through the same
// driver, so `make test` keeps the benchmark honest: everything is
// delivered, within the alarm bound, and every alarm re-armed exactly one
// schedule until the outbox was empty.
func TestDrainWithinBound(t *testing.T) {
	for _, plan := range []string{"free", "paid"} {
		t.Run(plan, func(t *testing.T) {
			bl := backlog{plan: plan, targets: 300, rowsPerTarget: 1, valueBytes: 16, perRequest: 128}
			f := run(t, bl)
			want := (bl.targets + f.budgetPerAlrm - 1) / f.budgetPerAlrm
			if f.alarms < want || f.alarms > f.bound {
				t.Errorf("%d alarms, want between %d and the bound %d", f.alarms, want, f.bound)
			}
			if f.busy != 0 {
				t.Errorf("%d alarms found the source busy with no concurrent fire", f.busy)
			}
			if f.apiCalls != 3 {
				t.Errorf("%d api calls, want 3", f.apiCalls)
			}
			// One schedule per enqueue-kick second plus one per re-arm.
			if f.schedCreated != f.alarms {
				t.Errorf("%d schedules created for %d alarms", f.schedCreated, f.alarms)
			}
			t.Logf("%s: %+v", plan, f)
		})
	}
}
