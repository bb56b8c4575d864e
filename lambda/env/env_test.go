package env

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"

	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

func valid() map[string]string {
	return map[string]string{
		VarPlan:             "free",
		VarSourceTable:      "relay-source",
		VarTargetTable:      "relay-target",
		VarDueIndex:         "due",
		VarScheduleGroup:    "relay-alarms",
		VarSchedulerRoleARN: "arn:aws:iam::123456789012:role/relay-scheduler",
		VarFireFunctionARN:  "arn:aws:lambda:eu-west-1:123456789012:function:relay-fire",
		VarRegion:           "eu-west-1",
	}
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseValid(t *testing.T) {
	for _, plan := range []string{"free", "paid", "Paid", " FREE "} {
		t.Run(plan, func(t *testing.T) {
			m := valid()
			m[VarPlan] = plan
			m[VarDynamoDBEndpoint] = "http://127.0.0.1:8000"
			c, err := Parse(getenv(m))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := relaycore.PlanBudget(plan)
			if c.Budget != want || c.Plan != strings.ToLower(strings.TrimSpace(plan)) {
				t.Errorf("plan %q: got %q %+v, want budget %+v", plan, c.Plan, c.Budget, want)
			}
			if c.LogLevel != slog.LevelInfo || c.DynamoDBEndpoint != "http://127.0.0.1:8000" || c.SchedulerEndpoint != "" {
				t.Errorf("config = %+v", c)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(m map[string]string)
		wants []string
	}{
		{"unknown plan", func(m map[string]string) { m[VarPlan] = "gold" }, []string{`PLAN="gold": unknown plan`}},
		{"no plan", func(m map[string]string) { delete(m, VarPlan) }, []string{"PLAN is required"}},
		{"log level", func(m map[string]string) { m[VarLogLevel] = "LOUD" }, []string{`LOG_LEVEL="LOUD"`}},
		{"due index", func(m map[string]string) { m[VarDueIndex] = "by-due" }, []string{`DUE_INDEX="by-due"`}},
		{"same table", func(m map[string]string) { m[VarTargetTable] = m[VarSourceTable] }, []string{"different tables"}},
		{"not an arn", func(m map[string]string) { m[VarFireFunctionARN] = "relay-fire" }, []string{`FIRE_FUNCTION_ARN="relay-fire" is not an ARN`}},
		{"endpoint", func(m map[string]string) { m[VarSchedulerEndpoint] = "localhost:8001" }, []string{"RELAY_SCHEDULER_ENDPOINT", "not an http(s) URL"}},
		{"lambda endpoint", func(m map[string]string) { m[VarLambdaEndpoint] = "ftp://x" }, []string{"RELAY_LAMBDA_ENDPOINT", "not an http(s) URL"}},
		{"hops above lambda's loop detection", func(m map[string]string) { m[VarContinuationHops] = "15" }, []string{`CONTINUATION_HOPS="15": want an integer 0..14`}},
		{"negative hops", func(m map[string]string) { m[VarContinuationHops] = "-1" }, []string{`CONTINUATION_HOPS="-1"`}},
		{"hops not a number", func(m map[string]string) { m[VarContinuationHops] = "many" }, []string{`CONTINUATION_HOPS="many"`}},
		{"fast kick", func(m map[string]string) { m[VarFastKick] = "yes" }, []string{`FAST_KICK="yes": want true or false`}},
		{"no concurrency", func(m map[string]string) { m[VarDeliverConcurrency] = "0" }, []string{`DELIVER_CONCURRENCY="0": want an integer 1..32`}},
		{"concurrency above the paid plan's targets", func(m map[string]string) { m[VarDeliverConcurrency] = "33" }, []string{`DELIVER_CONCURRENCY="33"`}},
		{"concurrency not a number", func(m map[string]string) { m[VarDeliverConcurrency] = "lots" }, []string{`DELIVER_CONCURRENCY="lots"`}},
		{"drain slice above half the timeout", func(m map[string]string) { m[VarDrainSlice] = "31s" }, []string{`DRAIN_SLICE="31s": want a duration 0s..30s`}},
		{"negative drain slice", func(m map[string]string) { m[VarDrainSlice] = "-1s" }, []string{`DRAIN_SLICE="-1s"`}},
		{"drain slice without a unit", func(m map[string]string) { m[VarDrainSlice] = "5" }, []string{`DRAIN_SLICE="5"`}},
		{"metrics namespace", func(m map[string]string) { m[VarMetricsNamespace] = "AWS/Lambda" }, []string{`METRICS_NAMESPACE="AWS/Lambda"`}},
		{"metrics stack", func(m map[string]string) { m[VarMetricsStack] = "caf\u00e9" }, []string{"METRICS_STACK", "dimension value"}},
		{"metrics per source", func(m map[string]string) { m[VarMetricsPerSource] = "yes" }, []string{`METRICS_PER_SOURCE="yes": want true or false`}},
		{"every problem at once", func(m map[string]string) { clear(m); m[VarPlan] = "enterprise" }, []string{
			"unknown plan", "SOURCE_TABLE is required", "TARGET_TABLE is required", "SCHEDULE_GROUP is required",
			"SCHEDULER_ROLE_ARN is required", "FIRE_FUNCTION_ARN is required", "AWS_REGION is required",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := valid()
			tc.edit(m)
			_, err := Parse(getenv(m))
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseContinuationHops(t *testing.T) {
	for in, want := range map[string]int{"": fire.DefaultMaxHops, "0": 0, " 3 ": 3, "14": fire.MaxContinuationHops} {
		m := valid()
		m[VarContinuationHops] = in
		c, err := Parse(getenv(m))
		if err != nil || c.ContinuationHops != want {
			t.Errorf("CONTINUATION_HOPS=%q: %d, %v; want %d", in, c.ContinuationHops, err, want)
		}
	}
}

// DRAIN_SLICE: 5 s by default, 0s: one alarm per invocation.
func TestParseDrainSlice(t *testing.T) {
	for in, want := range map[string]time.Duration{"": DefaultDrainSlice, "0s": 0, "1500ms": 1500 * time.Millisecond, "30s": MaxDrainSlice} {
		m := valid()
		m[VarDrainSlice] = in
		c, err := Parse(getenv(m))
		if err != nil || c.DrainSlice != want {
			t.Errorf("DRAIN_SLICE=%q: %v, %v; want %v", in, c.DrainSlice, err, want)
		}
	}
}

// TestParseFastKickAndConcurrency: FAST_KICK defaults to true (false is
// the Scheduler-only kick), DELIVER_CONCURRENCY to all of a fire's
// targets (32).
func TestParseFastKickAndConcurrency(t *testing.T) {
	for in, want := range map[string]bool{"": true, "true": true, " TRUE ": true, "false": false, "False": false} {
		m := valid()
		m[VarFastKick] = in
		c, err := Parse(getenv(m))
		if err != nil || c.FastKick != want {
			t.Errorf("FAST_KICK=%q: %v, %v; want %v", in, c.FastKick, err, want)
		}
	}
	for in, want := range map[string]int{"": DefaultDeliverConcurrency, "1": 1, " 16 ": 16, "32": MaxDeliverConcurrency} {
		m := valid()
		m[VarDeliverConcurrency] = in
		c, err := Parse(getenv(m))
		if err != nil || c.DeliverConcurrency != want {
			t.Errorf("DELIVER_CONCURRENCY=%q: %d, %v; want %d", in, c.DeliverConcurrency, err, want)
		}
	}
}

// IDLE_TARGET_TTL: a week by default, 0h never (negative for the engine,
// whose 0 is its default), out of range refused.
func TestParseIdleTargetTTL(t *testing.T) {
	for in, want := range map[string]time.Duration{"": DefaultIdleTargetTTL, "36h": 36 * time.Hour, "0h": -1} {
		m := valid()
		m[VarIdleTargetTTL] = in
		c, err := Parse(getenv(m))
		if err != nil || c.IdleTargetTTL != want {
			t.Errorf("IDLE_TARGET_TTL=%q: %v, %v; want %v", in, c.IdleTargetTTL, err, want)
		}
	}
	for _, in := range []string{"30m", "-1h", "forever", "87601h"} {
		m := valid()
		m[VarIdleTargetTTL] = in
		if _, err := Parse(getenv(m)); err == nil || !strings.Contains(err.Error(), VarIdleTargetTTL) {
			t.Errorf("IDLE_TARGET_TTL=%q not refused: %v", in, err)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	c, err := Parse(getenv(valid()))
	if err != nil || c.MetricsNamespace != "Relay" || c.MetricsStack != "relay" || c.MetricsPerSource {
		t.Errorf("defaults: %q %q %v, %v", c.MetricsNamespace, c.MetricsStack, c.MetricsPerSource, err)
	}
	m := valid()
	m[VarMetricsNamespace], m[VarMetricsStack], m[VarMetricsPerSource] = "Acme/Relay", "relay-prod", "True"
	c, err = Parse(getenv(m))
	if err != nil || c.MetricsNamespace != "Acme/Relay" || c.MetricsStack != "relay-prod" || !c.MetricsPerSource {
		t.Errorf("set: %q %q %v, %v", c.MetricsNamespace, c.MetricsStack, c.MetricsPerSource, err)
	}
}

func TestLoggerWritesLambdaJSON(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelWarn)
	log.Info("dropped")
	log.Warn("kept", "source", "orders")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1 (INFO filtered at WARN): %q", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("log line is not JSON: %v", err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "kept" || rec["source"] != "orders" {
		t.Errorf("record = %v", rec)
	}
}

func TestLoadRefusesBeforeWiring(t *testing.T) {
	m := valid()
	m[VarPlan] = "gold"
	if _, err := Load(t.Context(), getenv(m), &bytes.Buffer{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("Load err = %v, want ErrConfig", err)
	}
}

// TestWireFastKick: the fast kicker is built when FAST_KICK is on and only
// a function that asks (the api function) kicks through it; the fire,
// sweep and ops functions keep the Scheduler kicker. DELIVER_CONCURRENCY
// reaches the relay handler.
func TestWireFastKick(t *testing.T) {
	for _, fast := range []bool{true, false} {
		m := valid()
		m[VarFastKick] = map[bool]string{true: "true", false: "false"}[fast]
		m[VarDeliverConcurrency] = "5"
		c, err := Parse(getenv(m))
		if err != nil {
			t.Fatal(err)
		}
		d, err := Wire(c, aws.Config{Region: "eu-west-1"}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if d.Relay.Kicker != relaycore.Kicker(d.Kicker) || d.Relay.DeliverConcurrency != 5 {
			t.Fatalf("FAST_KICK=%v: relay kicker %T, concurrency %d", fast, d.Relay.Kicker, d.Relay.DeliverConcurrency)
		}
		if (d.FastKicker != nil) != fast {
			t.Fatalf("FAST_KICK=%v: fast kicker %v", fast, d.FastKicker)
		}
		d.UseFastKick()
		want := relaycore.Kicker(d.Kicker)
		if fast {
			want = d.FastKicker
		}
		if d.Relay.Kicker != want {
			t.Errorf("FAST_KICK=%v: after UseFastKick the relay kicks through %T", fast, d.Relay.Kicker)
		}
	}
}

// TestHandlers: the handlers the bootstraps serve (and lambda/emudeploy
// runs) are built on the wired dependencies: the api function's producer
// routes kick fast, its operator routes keep Scheduler, an unknown route
// set is refused by name; the fire and sweep handlers carry the metrics
// recorder Build wires.
func TestHandlers(t *testing.T) {
	build := func() *Deps {
		c, err := Parse(getenv(valid()))
		if err != nil {
			t.Fatal(err)
		}
		d, err := Build(c, aws.Config{Region: "eu-west-1"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for routes, fast := range map[string]bool{"": true, "producer": true, "all": true, "operator": false} {
		d := build()
		h, err := d.APIHandler(getenv(map[string]string{VarRoutes: routes}))
		if err != nil {
			t.Fatalf("routes %q: %v", routes, err)
		}
		want := relaycore.Kicker(d.Kicker)
		if fast {
			want = d.FastKicker
		}
		if h.Relay != d.Relay || d.Relay.Kicker != want {
			t.Errorf("routes %q: relay kicks through %T, fast = %v", routes, d.Relay.Kicker, fast)
		}
	}
	if _, err := build().APIHandler(getenv(map[string]string{VarRoutes: "admin"})); err == nil || !strings.Contains(err.Error(), VarRoutes) {
		t.Errorf("routes admin: err = %v, want one naming %s", err, VarRoutes)
	}
	d := build()
	if f := d.FireHandler(); d.Metrics == nil || f.Metrics != d.Metrics || f.Continue != d.Invoker || f.Relay != d.Relay {
		t.Errorf("fire handler %+v not on the wired deps", f)
	}
	if s := d.SweepHandler(); s.Metrics != d.Metrics || s.Kicker != d.Kicker || s.Relay != d.Relay {
		t.Errorf("sweep handler %+v not on the wired deps", s)
	}
}

// TestHTTPClientKeepsAFiresConnections: the AWS config Load builds keeps,
// idle, a connection for every request a fire has in flight at once (every
// target of a Paid fire and its own reads), where the SDK's default keeps
// 10 and closes the rest after each fire.
func TestHTTPClientKeepsAFiresConnections(t *testing.T) {
	cfg, err := loadAWSConfig(t.Context(), "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	hc, ok := cfg.HTTPClient.(*awshttp.BuildableClient)
	if !ok {
		t.Fatalf("HTTP client %T, want the SDK's buildable client", cfg.HTTPClient)
	}
	tr := hc.GetTransport()
	if tr.MaxIdleConnsPerHost < MaxDeliverConcurrency+4 || tr.MaxIdleConns < tr.MaxIdleConnsPerHost {
		t.Errorf("MaxIdleConnsPerHost %d, MaxIdleConns %d: want room for %d target batches and a fire's reads", tr.MaxIdleConnsPerHost, tr.MaxIdleConns, MaxDeliverConcurrency)
	}
}
