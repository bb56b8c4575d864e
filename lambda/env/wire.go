package env

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/smithy-go"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

var _ fire.Continuer = (*lambdainvoke.Invoker)(nil)

// Deps are a function's wired dependencies, built once per execution
// environment (at init, outside the handler) and shared by its
// invocations.
type Deps struct {
	Config Config
	Logger *slog.Logger
	Clock  relaycore.Clock
	// Source and Target are the two tables as relaycore stores. Source
	// also serves the due index (relaycore.DueIndex).
	Source, Target *dynamo.Store
	// Kicker arms one-time alarm schedules for the fire function.
	Kicker *scheduler.Kicker
	// Invoker continues a source by invoking the fire function
	// asynchronously; only the fire function uses it.
	Invoker *lambdainvoke.Invoker
	// FastKicker starts a fire due now with an async invoke of the fire
	// function and hands the rest to Kicker; nil when FAST_KICK=false.
	// Only the api function uses it (UseFastKick): its role and the fire
	// function's are the only ones granting lambda:InvokeFunction, each on
	// the fire function alone. The fire function keeps Kicker for its
	// re-arms (its continuations are the bounded fast path there), and the
	// sweep and ops functions keep Kicker too.
	FastKicker *lambdainvoke.Kicker
	// Relay runs fires and alarms with the plan's budget, kicking through
	// Kicker when it re-arms.
	Relay *relaycore.RelayHandler
	// Takedowns is the takedown owner on Relay: the api function serves
	// its routes, the sweep and fire functions run its passes.
	Takedowns *takedowns.Owner
	// Metrics writes EMF metric lines to the log output (Load) for the
	// fire and sweep functions; nil from Wire alone (Build sets it).
	Metrics *metrics.Recorder
}

// schedulerAttempts bounds the SDK's attempts per CreateSchedule. Kicks
// sit on the enqueue path and are best effort (the durable alarm and the
// sweep back them up), so one retry is enough.
const schedulerAttempts = 2

// lambdaAttempts bounds the SDK's attempts per continuation invoke, for
// the same reason: the alarm's Scheduler kick covers a lost one.
const lambdaAttempts = 2

// idleConnsPerHost is how many idle connections the functions' HTTP client
// keeps to one host (the SDK's default is 10): a fire's DynamoDB requests
// in flight at once, up to MaxDeliverConcurrency target batches beside its
// own reads and deletes, so that each fire reuses its connections instead
// of opening (TLS handshakes and all) those beyond ten again.
const idleConnsPerHost = MaxDeliverConcurrency + 16

// loadAWSConfig is the SDK's default config (credentials from its default
// chain) for region, with the SDK's default HTTP client keeping
// idleConnsPerHost idle connections to each host.
func loadAWSConfig(ctx context.Context, region string) (aws.Config, error) {
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = idleConnsPerHost
		t.MaxIdleConns = max(t.MaxIdleConns, 2*idleConnsPerHost)
	})
	return config.LoadDefaultConfig(ctx, config.WithRegion(region), config.WithHTTPClient(hc))
}

// Load parses the environment through getenv and wires the dependencies,
// logging JSON to logOut. AWS credentials come from the SDK's default
// chain (in Lambda: the function role's variables).
func Load(ctx context.Context, getenv func(string) string, logOut io.Writer) (*Deps, error) {
	cfg, err := Parse(getenv)
	if err != nil {
		return nil, err
	}
	awsCfg, err := loadAWSConfig(ctx, cfg.Region)
	if err != nil {
		return nil, fmt.Errorf("load aws config: %w", err)
	}
	d, err := Build(cfg, awsCfg, logOut)
	if err != nil {
		return nil, err
	}
	if err := d.CheckTables(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// tableCheckTimeout bounds CheckTables: a table that does not answer in
// it is left to the calls that need it (a slow start is not a wrong one).
const tableCheckTimeout = 2 * time.Second

// CheckTables reads, from SOURCE_TABLE and TARGET_TABLE, an item no batch
// writes (a Query, which every function's role may run on the tables it
// uses, as relay serve's readiness probe does), so that a misnamed table
// or a role without its grants stops the function at start-up, naming the
// variable, instead of failing every call that comes: on the target
// table, every apply, and every target quarantined after its failed
// rounds. A table that does not exist or refuses access is an ErrConfig
// error; any other failure (throttling, a timeout) is logged and left to
// the calls, which report it themselves.
func (d *Deps) CheckTables(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, tableCheckTimeout)
	defer cancel()
	var problems []string
	for _, t := range []struct {
		name, table string
		st          relaycore.Store
	}{{VarSourceTable, d.Config.SourceTable, d.Source}, {VarTargetTable, d.Config.TargetTable, d.Target}} {
		_, err := t.st.Scan(ctx, tableCheckPartition, relaycore.ScanRequest{Limit: 1})
		var api smithy.APIError
		switch {
		case err == nil:
		case errors.As(err, new(*types.ResourceNotFoundException)):
			problems = append(problems, fmt.Sprintf("%s=%q: no such table in %s (create it with the relay's layout, docs/dynamodb.md, or fix the name)", t.name, t.table, d.Config.Region))
		case errors.As(err, &api) && (api.ErrorCode() == "AccessDeniedException" || api.ErrorCode() == "UnrecognizedClientException"):
			problems = append(problems, fmt.Sprintf("%s=%q: %s: the function's role may not read it (its grants name the stack's tables, so a misnamed table is denied too): %v", t.name, t.table, api.ErrorCode(), api.ErrorMessage()))
		default:
			d.Logger.Warn("table check did not answer; the calls that need it will report it", "var", t.name, "table", t.table, "err", err)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(problems, "; "))
	}
	return nil
}

// tableCheckPartition is the partition CheckTables reads: under
// relaycore.ReservedPrefix, so no source or target ever has it.
const tableCheckPartition relaycore.Partition = "_relay/ping"

// Build wires the dependencies from a parsed Config and an AWS config,
// logging JSON and writing EMF metric lines to logOut: what Load does once
// it has the SDK's config, and what the emulated deployment
// (lambda/emudeploy) calls with its own endpoints' HTTP client.
func Build(cfg Config, awsCfg aws.Config, logOut io.Writer) (*Deps, error) {
	d, err := Wire(cfg, awsCfg, NewLogger(logOut, cfg.LogLevel))
	if err != nil {
		return nil, err
	}
	// Same writer as the logger: Lambda sends stdout to CloudWatch Logs,
	// which extracts the metrics.
	d.Metrics = &metrics.Recorder{
		Out: logOut, Namespace: cfg.MetricsNamespace, Stack: cfg.MetricsStack, PerSource: cfg.MetricsPerSource,
		State: d.Source, Clock: d.Clock, Logger: d.Logger,
	}
	return d, nil
}

// Wire builds the dependencies from a parsed Config and an AWS config.
func Wire(cfg Config, awsCfg aws.Config, logger *slog.Logger) (*Deps, error) {
	ddb := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.DynamoDBEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.DynamoDBEndpoint)
		}
	})
	sch := awsscheduler.NewFromConfig(awsCfg, func(o *awsscheduler.Options) {
		if cfg.SchedulerEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.SchedulerEndpoint)
		}
		o.RetryMaxAttempts = schedulerAttempts
	})
	clock := relaycore.SystemClock{}
	kicker, err := scheduler.New(scheduler.Config{
		Client:    sch,
		Group:     cfg.ScheduleGroup,
		TargetARN: cfg.FireFunctionARN,
		RoleARN:   cfg.SchedulerRoleARN,
		Now:       clock.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	lc := lambda.NewFromConfig(awsCfg, func(o *lambda.Options) {
		if cfg.LambdaEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.LambdaEndpoint)
		}
		o.RetryMaxAttempts = lambdaAttempts
	})
	invoker, err := lambdainvoke.New(lambdainvoke.Config{Client: lc, FunctionARN: cfg.FireFunctionARN})
	if err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	d := &Deps{
		Config:  cfg,
		Logger:  logger,
		Clock:   clock,
		Source:  dynamo.New(ddb, cfg.SourceTable, dynamo.Options{}),
		Target:  dynamo.New(ddb, cfg.TargetTable, dynamo.Options{}),
		Kicker:  kicker,
		Invoker: invoker,
	}
	if cfg.FastKick {
		d.FastKicker, err = lambdainvoke.NewKicker(lambdainvoke.KickerConfig{
			Client: lc, FunctionARN: cfg.FireFunctionARN, Fallback: kicker, Now: clock.Now, Logger: logger,
		})
		if err != nil {
			return nil, fmt.Errorf("wire: %w", err)
		}
	}
	d.Relay = &relaycore.RelayHandler{
		Source:             d.Source,
		Target:             d.Target,
		Budget:             cfg.Budget,
		Clock:              clock,
		Kicker:             kicker,
		Logger:             logger,
		DeliverConcurrency: cfg.DeliverConcurrency,
		IdleTargetTTL:      cfg.IdleTargetTTL,
		Hook:               takedowns.Hook{Delay: cfg.TakedownOverdue},
	}
	d.Takedowns = &takedowns.Owner{Relay: d.Relay, Roots: cfg.TakedownRoots, Logger: logger, CloseAfter: cfg.TakedownCloseAfter}
	return d, nil
}

// UseFastKick makes Relay kick through FastKicker, when FAST_KICK is on:
// the api function's enqueues (and its requeues and redrives under the
// all route set) then start a fire due now at once. Only a function whose
// role may invoke the fire function calls it (template.yaml: ApiFunction).
func (d *Deps) UseFastKick() {
	if d.FastKicker != nil {
		d.Relay.Kicker = d.FastKicker
	}
}
