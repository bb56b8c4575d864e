package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/relaycore"
)

const valueBytes = 200

// workload is one cost scenario: rows of one 200-byte put each under a
// 16-byte key, enqueued in batches spread over targets.
type workload struct {
	name        string
	rows        int
	batchRows   int
	targets     int
	interleaved bool // one alarm after every enqueue batch instead of draining a backlog
	plan        string
	payload     string // "json" (default) or "random"
}

var workloads = []workload{
	{name: "backlog/batch100/targets4", rows: 2000, batchRows: 100, targets: 4, plan: "paid"},
	{name: "backlog/batch100/targets32", rows: 3200, batchRows: 100, targets: 32, plan: "paid"},
	{name: "backlog/batch20/targets4", rows: 2000, batchRows: 20, targets: 4, plan: "paid"},
	{name: "interleaved/batch100/targets4", rows: 2000, batchRows: 100, targets: 4, interleaved: true, plan: "paid"},
	{name: "interleaved/batch20/targets4", rows: 2000, batchRows: 20, targets: 4, interleaved: true, plan: "free"},
	{name: "backlog/batch100/targets4/random-bytes", rows: 2000, batchRows: 100, targets: 4, plan: "paid", payload: "random"},
	{name: "backlog/batch400/targets4/random-bytes", rows: 4000, batchRows: 400, targets: 4, plan: "paid", payload: "random"},
}

func dynamoStores(b testing.TB) (*Meter, *Meter) {
	e := dynamotest.Start(b)
	client := e.Client(nil)
	ctx := context.Background()
	for _, t := range []string{"source", "target"} {
		if err := dynamo.CreateTable(ctx, client, t); err != nil {
			b.Fatal(err)
		}
	}
	opts := dynamo.Options{DueMode: dynamo.DueScan}
	return NewMeter(dynamo.New(client, "source", opts)), NewMeter(dynamo.New(client, "target", opts))
}

func rowsFor(w workload, from, n int) []relaycore.Row {
	rows := make([]relaycore.Row, n)
	for i := range rows {
		seq := from + i
		rows[i] = relaycore.Row{
			Target: relaycore.Partition(fmt.Sprintf("tgt-%03d", seq%w.targets)),
			Puts:   []relaycore.KV{{Key: fmt.Sprintf("user/%011d", seq), Value: payload(w.payload, uint64(seq))}},
		}
	}
	return rows
}

// payload returns row seq's 200-byte value. "json" is a user record with
// seeded random field values (names, e-mail, amounts, timestamps, a free-text
// note), the shape an application outbox carries; "random" is
// incompressible bytes, the worst case for any packing.
func payload(kind string, seq uint64) []byte {
	rng := rand.New(rand.NewPCG(seq, 0x5eed))
	if kind == "random" {
		v := make([]byte, valueBytes)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	}
	words := []string{"alpha", "bravo", "delta", "echo", "kilo", "lima", "mike", "oscar", "papa", "romeo", "sierra", "tango"}
	first := []string{"Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Radia", "Leslie", "Frances", "Donald"}
	name := first[rng.IntN(len(first))]
	v := fmt.Sprintf(`{"id":"u%011d","name":"%s","email":"%s%d@example.com","balance_cents":%d,"updated_at":"2026-11-%02dT%02d:%02d:%02dZ","note":"`,
		seq, name, strings.ToLower(name), rng.IntN(100000), rng.IntN(10000000), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), rng.IntN(60))
	for len(v) < valueBytes-2 {
		v += words[rng.IntN(len(words))] + " "
	}
	v = v[:valueBytes-2] + `"}`
	return []byte(v)
}

// BenchmarkCost reports DynamoDB capacity units per delivered row, end to
// end (enqueue + apply + cleanup), for the relay under several workloads
// and for the naive per-row outbox baseline, through the real SDK against
// the in-process DynamoDB-API endpoint. Units are priced by Meter.
func BenchmarkCost(b *testing.B) {
	durations := measuredDurations(b)
	b.Logf("Lambda durations: %s", durations.MeasuredBy)
	for _, w := range workloads {
		b.Run("relay/"+w.name, func(b *testing.B) {
			for range b.N {
				src, dst := dynamoStores(b)
				r := runRelay(b, w, src, dst)
				b.ReportMetric(r.enq/r.delivered, "wcu-enqueue/row")
				b.ReportMetric(r.apply/r.delivered, "wcu-apply/row")
				b.ReportMetric(r.cleanup/r.delivered, "wcu-cleanup/row")
				b.ReportMetric((r.enq+r.apply+r.cleanup)/r.delivered, "wcu/row")
				b.ReportMetric(r.rcu/r.delivered, "rcu/row")
				b.ReportMetric(float64(src.Calls+dst.Calls)/r.delivered, "calls/row")
				bill := billFor(w, r, durations)
				b.ReportMetric(bill.relay.Total, "usd/Mrows")
				b.ReportMetric(bill.streams.Total, "usd/Mrows-streams")
				b.ReportMetric(bill.sqs.Total, "usd/Mrows-sqsfifo")
				b.Logf("bill, %s: %s", USEast1.Region, bill.markdown())
			}
		})
	}
	b.Run("naive/per-row-transactions", func(b *testing.B) {
		for range b.N {
			src, dst := dynamoStores(b)
			n := runNaive(b, src, dst, 500)
			b.ReportMetric((src.WriteUnits+src.IndexUnits+dst.WriteUnits)/n, "wcu/row")
			b.ReportMetric((src.ReadUnits+dst.ReadUnits)/n, "rcu/row")
			b.ReportMetric(float64(src.Calls+dst.Calls)/n, "calls/row")
		}
	})
}

// relayRun is what a cost run counted: write units spent on enqueue,
// target apply and source cleanup (source writes by fires and alarms), read
// units, rows delivered, and the enqueue calls and alarms with the store
// calls each kind sent (what the bill prices as Lambda invocations).
type relayRun struct {
	enq, apply, cleanup, rcu, delivered float64
	enqueues, alarms                    int
	enqueueCalls, alarmCalls            int
}

// runRelay enqueues w's rows and fires alarms until the outbox is empty.
func runRelay(b testing.TB, w workload, src, dst *Meter) relayRun {
	var r relayRun
	calls := func() int { return src.Calls + dst.Calls }
	ctx := context.Background()
	budget, err := relaycore.PlanBudget(w.plan)
	if err != nil {
		b.Fatal(err)
	}
	clock := &stepClock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	h := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget, Clock: clock}
	const source = relaycore.Partition("src-bench")
	var rows int
	alarm := func() bool {
		before, c := src.WriteUnits+src.IndexUnits, calls()
		res, err := h.Alarm(ctx, source)
		if err != nil {
			b.Fatal(err)
		}
		r.cleanup += src.WriteUnits + src.IndexUnits - before
		r.alarms++
		r.alarmCalls += calls() - c
		rows += res.RowsDelivered
		return res.Cleared
	}
	for i := 0; i < w.rows; i += w.batchRows {
		before, c := src.WriteUnits+src.IndexUnits, calls()
		if _, err := (&relaycore.RelayHandler{Source: src, Clock: clock}).Enqueue(ctx, source, rowsFor(w, i, min(w.batchRows, w.rows-i)), relaycore.EnqueueOptions{}); err != nil {
			b.Fatal(err)
		}
		r.enq += src.WriteUnits + src.IndexUnits - before
		r.enqueues++
		r.enqueueCalls += calls() - c
		if w.interleaved {
			alarm()
		}
	}
	for guard := 0; !alarm(); guard++ {
		if guard > 10*w.rows {
			b.Fatal("outbox does not drain")
		}
	}
	if rows != w.rows {
		b.Fatalf("delivered %d rows, want %d", rows, w.rows)
	}
	r.apply, r.rcu, r.delivered = dst.WriteUnits, src.ReadUnits+dst.ReadUnits, float64(rows)
	return r
}

// stepClock is the clock of a cost run: it starts at a fixed instant and
// each reading is a millisecond after the last. Page headers carry commit
// times and pages are compressed, so with the wall clock a run's units
// could differ by a started KB from one run to the next; with this one the
// figures are counts of a fixed sequence of calls, which
// TestDocumentedCost compares with the docs.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

// runNaive is the baseline outbox: each row is enqueued, applied and
// deleted in its own 2-item transaction (row + guarded state record).
func runNaive(b *testing.B, src, dst *Meter, n int) float64 {
	ctx := context.Background()
	const source = relaycore.Partition("src-naive")
	v := make([]byte, valueBytes)
	var state, rh []byte
	for i := range n {
		seq := fmt.Sprintf("row/%011d", i)
		next := []byte(fmt.Sprint(i + 1))
		pre := relaycore.Precondition{Key: "os", Absent: state == nil, Value: state}
		row := append([]byte(fmt.Sprintf("tgt-000|user/%011d|", i)), v...)
		if err := src.Apply(ctx, source, relaycore.Batch{Preconditions: []relaycore.Precondition{pre},
			Writes: []relaycore.Write{{Key: "os", Value: next}, {Key: seq, Value: row}}}); err != nil {
			b.Fatal(err)
		}
		state = next
		rhPre := relaycore.Precondition{Key: "rh", Absent: rh == nil, Value: rh}
		if err := dst.Apply(ctx, "tgt-000", relaycore.Batch{Preconditions: []relaycore.Precondition{rhPre},
			Writes: []relaycore.Write{{Key: "rh", Value: next}, {Key: fmt.Sprintf("user/%011d", i), Value: v}}}); err != nil {
			b.Fatal(err)
		}
		rh = next
		done := []byte(fmt.Sprint("done", i+1))
		if err := src.Apply(ctx, source, relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "os", Value: state}},
			Writes: []relaycore.Write{{Key: "os", Value: done}, {Key: seq, Delete: true}}}); err != nil {
			b.Fatal(err)
		}
		state = done
	}
	return float64(n)
}

// The payloads are what the figures claim: 200 bytes, deterministic.
func TestPayload(t *testing.T) {
	for _, kind := range []string{"json", "random"} {
		a, b := payload(kind, 7), payload(kind, 7)
		if len(a) != valueBytes || string(a) != string(b) {
			t.Fatalf("%s payload: len %d, deterministic %v", kind, len(a), string(a) == string(b))
		}
	}
	if !json.Valid(payload("json", 42)) {
		t.Fatalf("json payload is not JSON: %s", payload("json", 42))
	}
}

// BenchmarkQuarantineRoundTrip prices a quarantine and ordered redrive:
// the backlog/batch100/targets4 workload where one of the four targets is
// quarantined by an operator after the first enqueue batch (so its later
// rows are held as fires meet them), then released once the rest drained.
// Same run, same workload without the quarantine as the baseline; the
// difference over the held rows is what holding and redriving a row costs.
func BenchmarkQuarantineRoundTrip(b *testing.B) {
	w := workload{name: "quarantine", rows: 2000, batchRows: 100, targets: 4, plan: "paid"}
	for range b.N {
		src, dst := dynamoStores(b)
		base := runRoundTrip(b, w, src, dst, false)
		src, dst = dynamoStores(b)
		q := runRoundTrip(b, w, src, dst, true)
		b.ReportMetric(base.wcu/base.rows, "wcu/row-baseline")
		b.ReportMetric(q.wcu/q.rows, "wcu/row")
		b.ReportMetric((q.wcu-base.wcu)/q.held, "extra-wcu/held-row")
		b.ReportMetric(q.opWCU, "operator-wcu")
		b.ReportMetric(q.held, "held-rows")
		b.ReportMetric(float64(q.calls-base.calls)/q.held, "extra-calls/held-row")
	}
}

type roundTrip struct {
	wcu, rows, held, opWCU float64
	calls                  int
}

func runRoundTrip(b *testing.B, w workload, src, dst *Meter, quarantine bool) roundTrip {
	ctx := context.Background()
	budget, err := relaycore.PlanBudget(w.plan)
	if err != nil {
		b.Fatal(err)
	}
	h := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget}
	const source = relaycore.Partition("src-bench")
	var r roundTrip
	drain := func() {
		for guard := 0; ; guard++ {
			res, err := h.Alarm(ctx, source)
			if err != nil {
				b.Fatal(err)
			}
			r.rows += float64(res.RowsDelivered)
			if res.Cleared {
				return
			}
			if guard > 10*w.rows {
				b.Fatal("outbox does not drain")
			}
		}
	}
	op := func(f func() error) {
		before := src.WriteUnits + src.IndexUnits
		if err := f(); err != nil {
			b.Fatal(err)
		}
		r.opWCU += src.WriteUnits + src.IndexUnits - before
	}
	for i := 0; i < w.rows; i += w.batchRows {
		if _, err := (&relaycore.RelayHandler{Source: src, Clock: relaycore.SystemClock{}}).Enqueue(ctx, source, rowsFor(w, i, min(w.batchRows, w.rows-i)), relaycore.EnqueueOptions{}); err != nil {
			b.Fatal(err)
		}
		if i == 0 && quarantine {
			op(func() error {
				_, err := h.Quarantine(ctx, source, "tgt-000", relaycore.Actor{By: "bench", Reason: "round trip"})
				return err
			})
		}
	}
	drain()
	if quarantine {
		st, err := relaycore.GetTarget(ctx, src, source, "tgt-000")
		if err != nil {
			b.Fatal(err)
		}
		r.held = float64(st.Held)
		op(func() error {
			_, err := h.Release(ctx, source, "tgt-000", relaycore.Actor{By: "bench", Reason: "round trip"})
			return err
		})
		drain()
	}
	if int(r.rows) != w.rows {
		b.Fatalf("delivered %v rows, want %d", r.rows, w.rows)
	}
	r.wcu = src.WriteUnits + src.IndexUnits + dst.WriteUnits
	r.calls = src.Calls + dst.Calls
	return r
}

// documentedCost names, for each workload whose cost the docs quote, the
// row of docs/benchmarks.md's cost table that holds its figures and the
// phrases (a format with its write units per row, %[1]s, and the relay's
// dollars per million rows to the cent, %[2]s) that quote them
// elsewhere. docs/benchmarks.md is where the figures live; the others
// quote it.
var documentedCost = []struct {
	workload, tableRow string
	quotes             map[string][]string // file -> phrases
}{
	{"backlog/batch100/targets4", "backlog, 100-row batches, 4 targets", map[string][]string{
		"docs/benchmarks.md": {"So a delivered 200-byte row costs %[1]s write units end to end"},
		"README.md":          {"a delivered row costs **%[1]s write units** end to end", "**$%[2]s per million delivered rows**"},
		"docs/engine.md":     {"**%[1]s** write units per delivered row for backlog/batch100/targets4"},
	}},
	{"backlog/batch100/targets4/random-bytes", "backlog, 100-row batches, 4 targets, random bytes", map[string][]string{
		"docs/benchmarks.md": {"Incompressible values (%[1]s)"},
		"docs/engine.md":     {"**%[1]s** for backlog/batch100/targets4/random-bytes", "stays near %[1]s with 100-row batches"},
	}},
}

// TestDocumentedCost runs the cost workloads the docs quote and checks
// that docs/benchmarks.md's table and every quote of it say what the
// workload costs today. Capacity units are counts of a fixed sequence of
// calls (stepClock), so a change to the engine that moves them fails here
// until the docs say the new figures (`go test -run TestDocumentedCost -v
// ./bench` prints them).
func TestDocumentedCost(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	bench := read("docs/benchmarks.md")
	durations := measuredDurations(t)
	for _, row := range durationRows(durations) {
		t.Log(row)
		if !strings.Contains(bench, row+"\n") {
			t.Errorf("docs/benchmarks.md's Lambda duration table has no row\n%s\nfor the durations the bill prices (%s)", row, DurationsFile)
		}
	}
	for _, d := range documentedCost {
		w := workloadNamed(t, d.workload)
		src, dst := dynamoStores(t)
		r := runRelay(t, w, src, dst)
		wcu := fmt.Sprintf("%.2f", (r.enq+r.apply+r.cleanup)/r.delivered)
		want := fmt.Sprintf("| %s | %.2f | %.2f | %.2f | **%s** | %.2f | %.2f |", d.tableRow, r.enq/r.delivered, r.apply/r.delivered,
			r.cleanup/r.delivered, wcu, r.rcu/r.delivered, float64(src.Calls+dst.Calls)/r.delivered)
		t.Logf("%s: %s", d.workload, want)
		if !strings.Contains(bench, want+"\n") {
			t.Errorf("docs/benchmarks.md's cost table has no row\n%s\nfor what %s costs today", want, d.workload)
		}
		br := billFor(w, r, durations)
		usd := fmt.Sprintf("%.2f", br.relay.Total)
		bill := "| " + d.tableRow + " " + br.markdown() + "\n"
		t.Logf("%s: %s", d.workload, bill)
		if !strings.Contains(bench, bill) {
			t.Errorf("docs/benchmarks.md's bill table has no row\n%sfor what %s costs today", bill, d.workload)
		}
		for file, phrases := range d.quotes {
			// Prose is wrapped anywhere: compare words.
			doc := strings.Join(strings.Fields(read(file)), " ")
			for _, p := range phrases {
				if q := fmt.Sprintf(p, wcu, usd); !strings.Contains(doc, q) {
					t.Errorf("%s does not say %q (%s costs %s write units, $%s per million rows today)", file, q, d.workload, wcu, usd)
				}
			}
		}
	}
}

func workloadNamed(t *testing.T, name string) workload {
	for _, w := range workloads {
		if w.name == name {
			return w
		}
	}
	t.Fatalf("no workload %s", name)
	return workload{}
}

// durationRows are docs/benchmarks.md's Lambda duration table rows for d.
func durationRows(d LambdaDurations) []string {
	row := func(name string, f FunctionDuration) string {
		n := float64(max(f.Invocations, 1))
		return fmt.Sprintf("| %s | %.2f | %.2f | %d invocations, %.1f DynamoDB requests and %.1f ms billed each | %s |",
			name, f.FixedMS, f.PerRequestMS, f.Invocations, float64(f.DynamoRequests)/n, float64(f.BilledMS)/n, d.MeasuredBy)
	}
	return []string{row("api", d.API), row("fire", d.Fire)}
}

// relayUsage is the serverless relay's usage for a cost run: every enqueue
// call is an api invocation, every alarm a fire invocation woken by one
// scheduled invocation, each lasting as durations says for its DynamoDB
// requests (the meter's calls).
func relayUsage(r relayRun, durations LambdaDurations) Usage {
	invocations := float64(r.enqueues + r.alarms)
	return Usage{
		WriteUnits:     r.enq + r.apply + r.cleanup,
		ReadUnits:      r.rcu,
		LambdaRequests: invocations,
		LambdaMillis: durations.API.Millis(float64(r.enqueues), float64(r.enqueueCalls)) +
			durations.Fire.Millis(float64(r.alarms), float64(r.alarmCalls)),
		LambdaMemoryMB:       lambdaMemoryMB,
		SchedulerInvocations: float64(r.alarms),
	}
}

// measuredDurations are the durations the bill prices: DurationsFile, or
// the assumption without one.
func measuredDurations(tb testing.TB) LambdaDurations {
	tb.Helper()
	d, err := ReadDurations(DurationsFile)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// billRow is a workload's row of docs/benchmarks.md's bill table: dollars
// per million delivered rows for the relay (DynamoDB, Lambda, Scheduler,
// total) and for the two alternatives.
type billRow struct {
	relay, streams, sqs Bill
}

func billFor(w workload, r relayRun, durations LambdaDurations) billRow {
	batch := streamsBatch
	if w.interleaved {
		batch = min(w.batchRows, streamsBatch)
	}
	return billRow{
		relay:   USEast1.PerMillionRows(relayUsage(r, durations), r.delivered),
		streams: USEast1.PerMillionRows(streamsUsage(w.rows, batch), float64(w.rows)),
		sqs:     USEast1.PerMillionRows(sqsUsage(w.rows), float64(w.rows)),
	}
}

// markdown is the row's cells after the workload's, as docs/benchmarks.md's
// bill table has them: the relay's DynamoDB, Lambda and Scheduler dollars
// and their total, then the two alternatives' totals.
func (b billRow) markdown() string {
	return fmt.Sprintf("| %.3f | %.3f | %.3f | **%.3f** | %.3f | %.3f |",
		b.relay.DynamoDB, b.relay.Lambda, b.relay.Scheduler, b.relay.Total, b.streams.Total, b.sqs.Total)
}

// TestBillArithmetic checks Prices.Cost and PerMillionRows on an example
// computed by hand, at the published prices:
//
//	2,500,000 WRU × $0.625/M                     = $1.5625
//	  400,000 RRU × $0.125/M                     = $0.05
//	  100,000 GetRecords units × $0.02/100,000   = $0.02
//	   30,000 Lambda requests × $0.20/M          = $0.006
//	   30,000 × 40 ms at 512 MB = 600 GB-s × $0.0000133334 = $0.00800004
//	   20,000 Scheduler invocations × $1.00/M    = $0.02
//	  300,000 SQS FIFO requests × $0.50/M        = $0.15
//
// for 1,000,000 rows, so per million rows the same; for 500,000 rows each
// doubles.
func TestBillArithmetic(t *testing.T) {
	u := Usage{
		WriteUnits: 2.5e6, ReadUnits: 4e5, StreamsReadUnits: 1e5,
		LambdaRequests: 3e4, LambdaMillis: 3e4 * 40, LambdaMemoryMB: 512,
		SchedulerInvocations: 2e4, SQSRequests: 3e5,
	}
	want := Bill{DynamoDB: 1.6325, Lambda: 0.01400004, Scheduler: 0.02, SQS: 0.15, Total: 1.81650004}
	near := func(got, want Bill) bool {
		for _, p := range [][2]float64{{got.DynamoDB, want.DynamoDB}, {got.Lambda, want.Lambda},
			{got.Scheduler, want.Scheduler}, {got.SQS, want.SQS}, {got.Total, want.Total}} {
			if math.Abs(p[0]-p[1]) > 1e-9 {
				return false
			}
		}
		return true
	}
	if got := USEast1.PerMillionRows(u, 1e6); !near(got, want) {
		t.Errorf("per million of 1,000,000 rows: %+v, want %+v", got, want)
	}
	double := Bill{DynamoDB: 2 * want.DynamoDB, Lambda: 2 * want.Lambda, Scheduler: 2 * want.Scheduler, SQS: 2 * want.SQS, Total: 2 * want.Total}
	if got := USEast1.PerMillionRows(u, 5e5); !near(got, double) {
		t.Errorf("per million of 500,000 rows: %+v, want %+v", got, double)
	}
}

// TestTemplatePricedAs: the bill prices Lambda at the memory size and
// architecture the template deploys (arm64's GB-second price); a change to
// either in template.yaml fails here until the bill follows.
func TestTemplatePricedAs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := string(b)
	for _, want := range []string{"    Architectures: [arm64]\n", fmt.Sprintf("    MemorySize: %d\n", lambdaMemoryMB)} {
		if !strings.Contains(tmpl, want) {
			t.Errorf("template.yaml's Globals have no %q: the bill's Lambda prices (bench/bill.go) assume it", strings.TrimSpace(want))
		}
	}
	if strings.Count(tmpl, "MemorySize:") != 1 || strings.Count(tmpl, "Architectures:") != 1 {
		t.Errorf("template.yaml sets MemorySize or Architectures per function: the bill prices every function at the Globals' %d MB arm64", lambdaMemoryMB)
	}
}

// TestFitDuration: the line through invocations that lie on one, the
// degenerate cases, and the fallback without a measurement.
func TestFitDuration(t *testing.T) {
	for _, c := range []struct {
		name       string
		ms         []int64
		reqs       []int
		fixed, per float64
	}{
		{"a line", []int64{40, 50, 70}, []int{2, 4, 8}, 30, 5},
		{"same requests", []int64{20, 40}, []int{3, 3}, 0, 10},
		{"below zero", []int64{1, 30}, []int{1, 10}, 0, 301.0 / 101},
		{"falling", []int64{50, 10}, []int{0, 0}, 30, 0},
	} {
		f := FitDuration(c.ms, c.reqs)
		if math.Abs(f.FixedMS-c.fixed) > 1e-9 || math.Abs(f.PerRequestMS-c.per) > 1e-9 || f.Invocations != len(c.ms) {
			t.Errorf("%s: %+v, want %.3f ms + %.3f ms per request", c.name, f, c.fixed, c.per)
		}
	}
	d, err := ReadDurations(filepath.Join(t.TempDir(), "none.json"))
	if err != nil || d != AssumedDurations {
		t.Errorf("no file: %+v %v, want the assumption", d, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"measured_by":"x","api":{},"fire":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDurations(bad); err == nil {
		t.Error("a file with no invocations was read")
	}
}
