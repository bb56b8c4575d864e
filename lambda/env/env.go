// Package env turns a Lambda function's environment into its wired
// dependencies: the plan's budget, the source and target DynamoDB stores,
// the EventBridge Scheduler kicker and a JSON logger. Only the functions'
// mains call it; handler packages take their dependencies as values.
//
// Parse checks every variable and reports all problems at once, so a
// misconfigured deployment fails its first (init) invocation with one
// readable message rather than misbehaving later. An unknown PLAN in
// particular is refused: running the free budget on a paid deployment (or
// the reverse) would silently change delivery rates and cost.
//
// The variables are declared in template.yaml's Globals; env.json gives
// `sam local invoke` its values.
package env

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// Variable names (template.yaml, Globals.Function.Environment).
const (
	VarPlan               = "PLAN"                     // free | paid (required)
	VarLogLevel           = "LOG_LEVEL"                // DEBUG | INFO | WARN | ERROR (default INFO)
	VarSourceTable        = "SOURCE_TABLE"             // source (outbox) table (required)
	VarTargetTable        = "TARGET_TABLE"             // target table (required)
	VarDueIndex           = "DUE_INDEX"                // must be dynamo.DueIndexName when set
	VarScheduleGroup      = "SCHEDULE_GROUP"           // alarm schedule group (required)
	VarSchedulerRoleARN   = "SCHEDULER_ROLE_ARN"       // role Scheduler assumes (required)
	VarFireFunctionARN    = "FIRE_FUNCTION_ARN"        // schedule target (required)
	VarDynamoDBEndpoint   = "RELAY_DYNAMODB_ENDPOINT"  // optional base URL (sam local, tests)
	VarSchedulerEndpoint  = "RELAY_SCHEDULER_ENDPOINT" // optional base URL (sam local, tests)
	VarLambdaEndpoint     = "RELAY_LAMBDA_ENDPOINT"    // optional base URL for continuations (tests)
	VarContinuationHops   = "CONTINUATION_HOPS"        // 0..fire.MaxContinuationHops (default fire.DefaultMaxHops)
	VarDrainSlice         = "DRAIN_SLICE"              // a Go duration, 0s..30s (default DefaultDrainSlice)
	VarFastKick           = "FAST_KICK"                // true | false (default true): the api function's fast kick
	VarDeliverConcurrency = "DELIVER_CONCURRENCY"      // 1..MaxDeliverConcurrency (default DefaultDeliverConcurrency)
	VarIdleTargetTTL      = "IDLE_TARGET_TTL"          // a Go duration, 1h..87600h, or 0h: never (default 168h)
	VarMetricsNamespace   = "METRICS_NAMESPACE"        // CloudWatch namespace (default metrics.DefaultNamespace)
	VarMetricsStack       = "METRICS_STACK"            // Stack dimension value (default "relay")
	VarMetricsPerSource   = "METRICS_PER_SOURCE"       // true | false (default false): add the Source dimension
	VarRegion             = "AWS_REGION"               // set by Lambda (required)
)

// DefaultDeliverConcurrency is how many targets of a fire the fire and
// sweep functions deliver at once (relaycore.RelayHandler.DeliverConcurrency):
// all of them, the plan's targets per fire (8 Free, 32 Paid). A fire's
// target batches are network round trips to DynamoDB, each to a partition
// of its own, so overlapping them all makes the fire's delivery about one
// round trip long; the rest of a fire (its reads, its checkpoint) is a
// handful of round trips, and with fewer at once delivery stays most of
// it (docs/benchmarks.md, the burst). Budgets and each target's order are
// unchanged (docs/engine.md).
const DefaultDeliverConcurrency = MaxDeliverConcurrency

// MaxDeliverConcurrency bounds DELIVER_CONCURRENCY: the paid plan's targets
// per fire (more could never overlap). The functions' HTTP client keeps
// that many connections to DynamoDB open and some (idleConnsPerHost).
const MaxDeliverConcurrency = 32

// DefaultDrainSlice is DRAIN_SLICE's default (lambda/fire.Handler.DrainSlice):
// how long a fire invocation keeps running alarms for a draining source
// before it hands over to the next hop. A chain of 13 invocations then
// drains for over a minute before it waits for a schedule, and an
// invocation holds its execution environment, which other sources' events
// wait for when the reserved concurrency is in use, for about five
// seconds and an alarm.
const DefaultDrainSlice = 5 * time.Second

// MaxDrainSlice bounds DRAIN_SLICE: half the fire function's 60 s timeout.
const MaxDrainSlice = 30 * time.Second

// DefaultIdleTargetTTL is IDLE_TARGET_TTL's default, the engine's: a week.
const DefaultIdleTargetTTL = 7 * 24 * time.Hour

// ErrConfig is wrapped by every error Parse returns.
var ErrConfig = errors.New("invalid function configuration")

// Config is a function's parsed environment.
type Config struct {
	// Plan is "free" or "paid"; Budget is relaycore.PlanBudget(Plan).
	Plan   string
	Budget relaycore.RelayBudget
	// LogLevel filters the JSON logs (Lambda's ApplicationLogLevel filters
	// again on the "level" field, so the two agree).
	LogLevel slog.Level

	SourceTable, TargetTable string
	ScheduleGroup            string
	SchedulerRoleARN         string
	FireFunctionARN          string
	// DynamoDBEndpoint, SchedulerEndpoint and LambdaEndpoint override the
	// AWS endpoints when non-empty (local DynamoDB-API servers, test
	// fakes).
	DynamoDBEndpoint, SchedulerEndpoint, LambdaEndpoint string
	Region                                              string
	// ContinuationHops bounds the fire function's self-invocations per
	// kick (lambda/fire); 0 turns them off. Only the fire function uses it.
	ContinuationHops int
	// DrainSlice is lambda/fire.Handler.DrainSlice: how long one fire
	// invocation runs alarms for a source that continues before it hands
	// over to the next hop (0: one alarm per invocation).
	DrainSlice time.Duration
	// FastKick: the api function starts a fire due now with an async
	// invoke of the fire function (lambdainvoke.Kicker), falling back to
	// Scheduler; false kicks through Scheduler only (before the fast
	// kick; the benchmarks' baseline). Only the api function uses it.
	FastKick bool
	// DeliverConcurrency is relaycore.RelayHandler.DeliverConcurrency for
	// the fire and sweep functions' alarms.
	DeliverConcurrency int
	// IdleTargetTTL is relaycore.RelayHandler.IdleTargetTTL for the fire
	// and sweep functions' alarms (negative: never).
	IdleTargetTTL time.Duration
	// MetricsNamespace, MetricsStack and MetricsPerSource configure the
	// fire and sweep functions' EMF metrics (lambda/metrics).
	MetricsNamespace string
	MetricsStack     string
	MetricsPerSource bool
	// TakedownRoots, TakedownOverdue and HoldNodes configure the takedown
	// owner (takedown.go).
	TakedownRoots   *x509.CertPool
	TakedownOverdue time.Duration
	// TakedownCloseAfter is takedowns.Owner.CloseAfter.
	TakedownCloseAfter time.Duration
	HoldNodes          map[string]string
}

// Parse reads the configuration through getenv (os.Getenv in mains) and
// returns every problem found, joined, wrapped in ErrConfig.
func Parse(getenv func(string) string) (Config, error) {
	var (
		c    Config
		errs []error
	)
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	required := func(name string) string {
		v := get(name)
		if v == "" {
			bad("%s is required", name)
		}
		return v
	}

	switch plan := strings.ToLower(get(VarPlan)); plan {
	case "":
		bad("%s is required (free or paid)", VarPlan)
	default:
		b, err := relaycore.PlanBudget(plan)
		if err != nil {
			bad("%s=%q: unknown plan (want free or paid)", VarPlan, getenv(VarPlan))
			break
		}
		c.Plan, c.Budget = plan, b
	}

	c.LogLevel = slog.LevelInfo
	if lv := get(VarLogLevel); lv != "" {
		if err := c.LogLevel.UnmarshalText([]byte(lv)); err != nil {
			bad("%s=%q: want DEBUG, INFO, WARN or ERROR", VarLogLevel, lv)
		}
	}

	c.SourceTable = required(VarSourceTable)
	c.TargetTable = required(VarTargetTable)
	if c.SourceTable != "" && c.SourceTable == c.TargetTable {
		// Source and target partitions would share one key space, and
		// source cleanup must never race target writes on one item.
		bad("%s and %s must name different tables (both %q)", VarSourceTable, VarTargetTable, c.SourceTable)
	}
	if idx := get(VarDueIndex); idx != "" && idx != dynamo.DueIndexName {
		bad("%s=%q: the store queries the index %q (docs/dynamodb.md)", VarDueIndex, idx, dynamo.DueIndexName)
	}
	c.ScheduleGroup = required(VarScheduleGroup)
	c.SchedulerRoleARN = required(VarSchedulerRoleARN)
	c.FireFunctionARN = required(VarFireFunctionARN)
	for _, arn := range [][2]string{{VarSchedulerRoleARN, c.SchedulerRoleARN}, {VarFireFunctionARN, c.FireFunctionARN}} {
		if arn[1] != "" && !strings.HasPrefix(arn[1], "arn:") {
			bad("%s=%q is not an ARN", arn[0], arn[1])
		}
	}
	c.Region = required(VarRegion)

	c.ContinuationHops = fire.DefaultMaxHops
	if v := get(VarContinuationHops); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > fire.MaxContinuationHops {
			// Above the limit Lambda's recursive loop detection would stop
			// the chain and dead-letter its event.
			bad("%s=%q: want an integer 0..%d", VarContinuationHops, v, fire.MaxContinuationHops)
		} else {
			c.ContinuationHops = n
		}
	}

	c.DrainSlice = DefaultDrainSlice
	if v := get(VarDrainSlice); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > MaxDrainSlice {
			bad("%s=%q: want a duration 0s..%s (0s: one alarm per invocation)", VarDrainSlice, v, MaxDrainSlice)
		} else {
			c.DrainSlice = d
		}
	}

	c.FastKick = true
	switch v := strings.ToLower(get(VarFastKick)); v {
	case "", "true":
	case "false":
		c.FastKick = false
	default:
		bad("%s=%q: want true or false", VarFastKick, getenv(VarFastKick))
	}

	c.DeliverConcurrency = DefaultDeliverConcurrency
	if v := get(VarDeliverConcurrency); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxDeliverConcurrency {
			bad("%s=%q: want an integer 1..%d (1: one target after another)", VarDeliverConcurrency, v, MaxDeliverConcurrency)
		} else {
			c.DeliverConcurrency = n
		}
	}

	c.IdleTargetTTL = DefaultIdleTargetTTL
	if v := get(VarIdleTargetTTL); v != "" {
		d, err := time.ParseDuration(v)
		switch {
		case err == nil && d == 0:
			c.IdleTargetTTL = -1 // never; 0 is the engine's default
		case err != nil || d < time.Hour || d > 87600*time.Hour:
			bad("%s=%q: want a duration 1h..87600h, or 0h (never)", VarIdleTargetTTL, v)
		default:
			c.IdleTargetTTL = d
		}
	}

	c.MetricsNamespace = metrics.DefaultNamespace
	if v := get(VarMetricsNamespace); v != "" {
		if !metrics.NamespaceOK(v) {
			bad("%s=%q: want 1..255 of letters, digits and . - _ / # : space, not starting with AWS/", VarMetricsNamespace, v)
		} else {
			c.MetricsNamespace = v
		}
	}
	c.MetricsStack = "relay"
	if v := get(VarMetricsStack); v != "" {
		if !metrics.DimensionValueOK(v) {
			bad("%s=%q: not a CloudWatch dimension value (1..1024 printable ASCII characters)", VarMetricsStack, v)
		} else {
			c.MetricsStack = v
		}
	}
	switch v := strings.ToLower(get(VarMetricsPerSource)); v {
	case "", "false":
	case "true":
		c.MetricsPerSource = true
	default:
		bad("%s=%q: want true or false", VarMetricsPerSource, getenv(VarMetricsPerSource))
	}

	for _, ep := range []struct {
		name string
		dst  *string
	}{{VarDynamoDBEndpoint, &c.DynamoDBEndpoint}, {VarSchedulerEndpoint, &c.SchedulerEndpoint}, {VarLambdaEndpoint, &c.LambdaEndpoint}} {
		v := get(ep.name)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("%s=%q is not an http(s) URL", ep.name, v)
			continue
		}
		*ep.dst = v
	}

	parseTakedowns(get, bad, &c)

	if len(errs) > 0 {
		return c, fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return c, nil
}

// NewLogger returns the functions' structured logger: one JSON object per
// line on w, with "level" and "msg" keys, which Lambda's JSON log format
// (LoggingConfig.LogFormat JSON) indexes and filters by level.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
