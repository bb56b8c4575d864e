//go:build unix

package emudeploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/lambda/api"
)

// DefaultAPILatency holds each Scheduler and Lambda API response: the
// 30 ms per request the cost benchmark (lambda/bench) assumes for an
// in-region AWS API call. AWS publishes no figure.
const DefaultAPILatency = 30 * time.Millisecond

// Defaults for Config.
const (
	DefaultFireConcurrency = 4
	DefaultAPIConcurrency  = 4
	DefaultSweepPeriod     = time.Minute
)

// The names a Deployment gives its resources, as env.json does.
const (
	SourceTable = "relay-source"
	TargetTable = "relay-target"
	FireARN     = "arn:aws:lambda:us-east-1:123456789012:function:relay-fire"
)

// Config describes an emulated deployment. Zero fields take the defaults
// documented on each.
type Config struct {
	// RIE is the aws-lambda-rie binary; Bootstraps the functions' binaries
	// by name (Build).
	RIE        string
	Bootstraps map[string]string
	// Plan is the PLAN of every function (default free).
	Plan string
	// Env adds to or overrides each function's environment, by function
	// name ("api", "fire", "sweep"): FAST_KICK, DELIVER_CONCURRENCY, ...
	Env map[string]map[string]string
	// FireConcurrency is the fire function's reserved concurrency: its
	// execution environments, each a bootstrap under the emulator
	// (default DefaultFireConcurrency; the template reserves 20, but one
	// source runs one alarm at a time, so a few sources never need more).
	FireConcurrency int
	// APIConcurrency is the api function's environments, which Enqueue
	// shares (default DefaultAPIConcurrency).
	APIConcurrency int
	// Seed seeds every modelled delay.
	Seed uint64
	// DynamoLatency draws each DynamoDB request's latency (default
	// DefaultDynamoLatency); APILatency holds each Scheduler and Lambda
	// API response (default DefaultAPILatency; negative: none); QueueDelay
	// is the fire function's async queue delay (default
	// DefaultQueueDelay).
	DynamoLatency func(*rand.Rand) time.Duration
	APILatency    time.Duration
	QueueDelay    func(*rand.Rand) time.Duration
	// Precision is Scheduler's (default DefaultPrecision); SweepPeriod the
	// sweep's rate (default a minute). Tests shorten both.
	Precision, SweepPeriod time.Duration
	// LogLevel is every function's LOG_LEVEL (default WARN).
	LogLevel string
	// InProcess runs the functions in this process instead of under the
	// emulator: each environment wired by lambda/env from the same
	// variables and its handler called directly, every endpoint reached
	// through an in-memory transport (no socket), every modelled delay a
	// timer. Started inside a testing/synctest bubble, the deployment then
	// runs on virtual time: a discrete-event model of the same deployment,
	// whose figures do not depend on the machine (the handlers' own CPU
	// time counts as zero). RIE and Bootstraps are not used.
	InProcess bool
	// PruneApplied deletes each row's item from the target table once its
	// apply time is recorded (the relay reads only its rh records there),
	// so the DynamoDB emulator, whose cost per request grows with the
	// table, stays as cheap as a small table through a long run. Applied
	// still reports every row; Target no longer holds them.
	PruneApplied bool
}

// Deployment is the serverless relay on one machine: the api, fire and
// sweep bootstraps under the Lambda runtime emulator, DynamoDB (the
// in-process emulator behind a latency front), Scheduler, and Lambda's
// async invoke path, modelled as documented on Async, RunAt and
// DefaultDynamoLatency. It is for benchmarks and tests; no binary links
// it.
type Deployment struct {
	// Source and Target are the tables, reached without the latency
	// front (for checks, not for the relay).
	Source, Target *dynamo.Store

	ddb       *dynamoemu.Endpoint
	front     *dynamoFront
	sched     *Scheduler
	schedURL  string
	invokes   map[string]*Invoke // by calling function
	api, fire *Function
	sweep     *Function
	envs      []*rieEnv
	servers   []*http.Server
	mem       memTransport // InProcess: the endpoints by host
	inProcess bool
	stopSweep chan struct{}
	home      string

	mu       sync.Mutex
	keys     map[Environment]string // each environment's access key
	fireBusy int
	swept    int // rows the sweep delivered
}

// Start runs a deployment; Close ends it.
func Start(cfg Config) (d *Deployment, err error) {
	if !cfg.InProcess && (cfg.RIE == "" || len(cfg.Bootstraps) != len(Functions)) {
		return nil, errors.New("emudeploy: Config needs RIE and the api, fire and sweep bootstraps")
	}
	cfg = withDefaults(cfg)
	d = &Deployment{invokes: map[string]*Invoke{}, keys: map[Environment]string{}, stopSweep: make(chan struct{}), mem: memTransport{}, inProcess: cfg.InProcess}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if !cfg.InProcess {
		if d.home, err = os.MkdirTemp("", "relay-emudeploy-"); err != nil {
			return nil, err
		}
	}
	var upstream any
	var client *dynamodb.Client
	if cfg.InProcess {
		d.ddb = dynamoemu.NewHandler()
		upstream = d.ddb
		raw, _ := d.serve("dynamodb-direct", d.ddb)
		client = dynamoemu.NewClient(raw, d.mem)
	} else {
		if d.ddb, err = dynamoemu.New(); err != nil {
			return nil, err
		}
		upstream = d.ddb.URL
		client = d.ddb.Client(nil)
	}
	for _, tbl := range []string{SourceTable, TargetTable} {
		if err := dynamo.CreateTable(context.Background(), client, tbl); err != nil {
			return nil, err
		}
	}
	d.Source = dynamo.New(client, SourceTable, dynamo.Options{})
	d.Target = dynamo.New(client, TargetTable, dynamo.Options{})
	if d.front, err = newDynamoFront(upstream, TargetTable, cfg.DynamoLatency, cfg.Seed); err != nil {
		return nil, err
	}
	d.front.prune = cfg.PruneApplied
	ddbURL, err := d.serve("dynamodb", d.front)
	if err != nil {
		return nil, err
	}

	clk := SystemClock{}
	apiLatency := max(cfg.APILatency, 0)
	fireEnvs, err := d.startEnvs("fire", cfg, cfg.FireConcurrency, 60*time.Second, ddbURL, apiLatency)
	if err != nil {
		return nil, err
	}
	d.fire = NewFunction("fire", clk, Async{QueueDelay: cfg.QueueDelay, MaxEventAge: time.Hour, MaxRetries: 2}, cfg.Seed+1, fireEnvs...)
	d.fire.onResult, d.fire.requests = d.fireResult, d.envRequests
	// The template's sweep: no retries, events older than 60 s dropped.
	sweepEnvs, err := d.startEnvs("sweep", cfg, 1, 50*time.Second, ddbURL, apiLatency)
	if err != nil {
		return nil, err
	}
	d.sweep = NewFunction("sweep", clk, Async{QueueDelay: cfg.QueueDelay, MaxEventAge: time.Minute}, cfg.Seed+2, sweepEnvs...)
	d.sweep.onResult, d.sweep.requests = d.sweepResult, d.envRequests
	apiEnvs, err := d.startEnvs("api", cfg, cfg.APIConcurrency, 30*time.Second, ddbURL, apiLatency)
	if err != nil {
		return nil, err
	}
	d.api = NewFunction("api", clk, Async{}, cfg.Seed+3, apiEnvs...)
	d.api.requests = d.envRequests
	Sweep(clk, cfg.SweepPeriod, cfg.Seed+4, d.stopSweep, d.sweep.Queue)
	return d, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Plan == "" {
		cfg.Plan = "free"
	}
	if cfg.FireConcurrency <= 0 {
		cfg.FireConcurrency = DefaultFireConcurrency
	}
	if cfg.APIConcurrency <= 0 {
		cfg.APIConcurrency = DefaultAPIConcurrency
	}
	if cfg.DynamoLatency == nil {
		cfg.DynamoLatency = DefaultDynamoLatency
	}
	if cfg.APILatency == 0 {
		cfg.APILatency = DefaultAPILatency
	}
	if cfg.QueueDelay == nil {
		cfg.QueueDelay = DefaultQueueDelay
	}
	if cfg.Precision == 0 {
		cfg.Precision = DefaultPrecision
	}
	if cfg.SweepPeriod == 0 {
		cfg.SweepPeriod = DefaultSweepPeriod
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "WARN"
	}
	return cfg
}

// startEnvs starts n environments of the named function, each with its
// own Scheduler and Invoke endpoints wired in (the Scheduler is shared;
// an Invoke endpoint per function, so counts say who invoked).
func (d *Deployment) startEnvs(name string, cfg Config, n int, timeout time.Duration, ddbURL string, apiLatency time.Duration) ([]Environment, error) {
	if d.sched == nil {
		d.sched = NewScheduler(SystemClock{}, cfg.Precision, apiLatency, cfg.Seed+5, func(arn string, input []byte) {
			if arn == FireARN {
				d.fire.Queue(input)
			}
		})
		u, err := d.serve("scheduler", d.sched)
		if err != nil {
			return nil, err
		}
		d.schedURL = u
	}
	arn := FireARN
	if name == "sweep" {
		arn = "none: the sweep function invokes nothing"
	}
	inv := NewInvoke(arn, apiLatency, func(p []byte) { d.fire.Queue(p) })
	d.invokes[name] = inv
	invURL, err := d.serve("lambda-"+name, inv)
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		"PLAN": cfg.Plan, "LOG_LEVEL": cfg.LogLevel,
		"SOURCE_TABLE": SourceTable, "TARGET_TABLE": TargetTable, "DUE_INDEX": dynamo.DueIndexName,
		"SCHEDULE_GROUP": "relay-alarms", "SCHEDULER_ROLE_ARN": "arn:aws:iam::123456789012:role/relay-scheduler",
		"FIRE_FUNCTION_ARN":       FireARN,
		"RELAY_DYNAMODB_ENDPOINT": ddbURL, "RELAY_SCHEDULER_ENDPOINT": d.schedURL, "RELAY_LAMBDA_ENDPOINT": invURL,
		"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "relay", "AWS_SECRET_ACCESS_KEY": "relay",
	}
	switch name {
	case "api":
		env["RELAY_API_ROUTES"] = "producer"
	case "fire":
		env["CONTINUATION_HOPS"] = "12" // the template's default
	}
	for k, v := range cfg.Env[name] {
		env[k] = v
	}
	var out []Environment
	for i := range n {
		// Each environment signs with its own access key, so the DynamoDB
		// front counts its requests (Invocation.DynamoRequests).
		id := fmt.Sprintf("%s-%d", name, i)
		env := maps.Clone(env)
		env["AWS_ACCESS_KEY_ID"] = id
		var e Environment
		if d.inProcess {
			ie, err := newInProcEnv(name, env, &http.Client{Transport: d.mem}, timeout)
			if err != nil {
				return nil, err
			}
			e = ie
		} else {
			re, err := startRIE(id, cfg.RIE, cfg.Bootstraps[name], d.home, env, timeout)
			if err != nil {
				return nil, err
			}
			d.mu.Lock()
			d.envs = append(d.envs, re)
			d.mu.Unlock()
			e = re
		}
		d.mu.Lock()
		d.keys[e] = id
		d.mu.Unlock()
		out = append(out, e)
	}
	return out, nil
}

// envRequests is the DynamoDB requests environment e has made so far.
func (d *Deployment) envRequests(e Environment) int {
	d.mu.Lock()
	key := d.keys[e]
	d.mu.Unlock()
	return d.front.requestsBy(key)
}

// serve runs h on 127.0.0.1 until Close, or in process at the host
// name, and returns its URL.
func (d *Deployment) serve(name string, h http.Handler) (string, error) {
	if d.inProcess {
		d.mem[name+".emu"] = h
		return "http://" + name + ".emu", nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, Addr: l.Addr().String()}
	d.servers = append(d.servers, srv)
	go func() { _ = srv.Serve(l) }()
	return "http://" + srv.Addr, nil
}

// Close stops the sweep, the functions (waiting for the invocations that
// run), the endpoints and the processes. It may be called again; Stats,
// Invocations and Applied still answer after it.
func (d *Deployment) Close() {
	select {
	case <-d.stopSweep:
	default:
		close(d.stopSweep)
	}
	for _, f := range []*Function{d.api, d.fire, d.sweep} {
		if f != nil {
			f.Close()
		}
	}
	for _, e := range d.envs {
		e.stop()
	}
	for _, s := range d.servers {
		_ = s.Close()
	}
	if d.ddb != nil {
		d.ddb.Close()
	}
	if d.home != "" {
		_ = os.RemoveAll(d.home)
	}
}

// RefuseKicks makes the api function's Invoke endpoint answer status to
// every request (0: accept): the fast kick refused, while the fire
// function's continuations still go through.
func (d *Deployment) RefuseKicks(status int) { d.invokes["api"].Refuse(status) }

// Enqueue posts rows to source through the api function, as a producer's
// signed request to its function URL arrives, with idempotencyKey (when
// not empty) in its Idempotency-Key header, and returns the HTTP status
// and body the function answered.
func (d *Deployment) Enqueue(ctx context.Context, source string, rows []api.RowJSON, idempotencyKey string) (int, string, error) {
	body, err := json.Marshal(api.EnqueueRequest{Rows: rows})
	if err != nil {
		return 0, "", err
	}
	path := "/v1/sources/" + source + "/rows"
	req := events.LambdaFunctionURLRequest{Version: "2.0", RawPath: path, Body: string(body),
		Headers: map[string]string{"content-type": "application/json"}}
	if idempotencyKey != "" {
		req.Headers[strings.ToLower(api.IdempotencyKeyHeader)] = idempotencyKey
	}
	req.RequestContext.HTTP.Method = http.MethodPost
	req.RequestContext.HTTP.Path = path
	req.RequestContext.Authorizer = &events.LambdaFunctionURLRequestContextAuthorizerDescription{
		IAM: &events.LambdaFunctionURLRequestContextAuthorizerIAMDescription{UserARN: "arn:aws:sts::123456789012:assumed-role/producer/emudeploy"}}
	payload, err := json.Marshal(req)
	if err != nil {
		return 0, "", err
	}
	res, err := d.api.Invoke(ctx, payload)
	if err != nil {
		return 0, "", err
	}
	var resp events.LambdaFunctionURLResponse
	if err := json.Unmarshal(res, &resp); err != nil || functionError(res) {
		return 0, "", fmt.Errorf("api: %s", res)
	}
	return resp.StatusCode, resp.Body, nil
}

// Applied returns when each target key was first written by a committed
// delivery (keys of rh records included).
func (d *Deployment) Applied() map[string]time.Time {
	d.front.mu.Lock()
	defer d.front.mu.Unlock()
	out := make(map[string]time.Time, len(d.front.applied))
	for k, t := range d.front.applied {
		out[k] = t
	}
	return out
}

// WaitApplied waits until every key in keys has been applied, or ctx ends.
func (d *Deployment) WaitApplied(ctx context.Context, keys []string) error {
	for {
		d.front.mu.Lock()
		missing := 0
		for _, k := range keys {
			if _, ok := d.front.applied[k]; !ok {
				missing++
			}
		}
		changed := d.front.changed
		d.front.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d keys not applied: %w", missing, len(keys), ctx.Err())
		}
	}
}

// Stats is what a deployment did, in the units AWS bills.
type Stats struct {
	API, Fire, Sweep FunctionStats
	// FireBusy fire invocations found another fire at work; SweepRows
	// rows were delivered by the sweep's in-process alarms.
	FireBusy, SweepRows int
	// Kicks are the api function's async invokes of the fire function;
	// Continuations the fire function's own.
	Kicks, Continuations InvokeStats
	Scheduler            SchedulerStats
	// DynamoRequests reached the DynamoDB endpoint from the functions.
	DynamoRequests int
}

// Stats returns the counters so far.
func (d *Deployment) Stats() Stats {
	d.mu.Lock()
	s := Stats{FireBusy: d.fireBusy, SweepRows: d.swept}
	d.mu.Unlock()
	s.API, s.Fire, s.Sweep = d.api.Stats(), d.fire.Stats(), d.sweep.Stats()
	s.Kicks, s.Continuations = d.invokes["api"].Stats(), d.invokes["fire"].Stats()
	s.Scheduler = d.sched.Stats()
	d.front.mu.Lock()
	s.DynamoRequests = d.front.requests
	d.front.mu.Unlock()
	return s
}

// Invocations returns the invocations of the named function ("api",
// "fire", "sweep") that ended, each with its duration and DynamoDB
// requests: what its Lambda duration would be billed from.
func (d *Deployment) Invocations(function string) []Invocation {
	switch function {
	case "api":
		return d.api.Invocations()
	case "fire":
		return d.fire.Invocations()
	case "sweep":
		return d.sweep.Invocations()
	}
	return nil
}

// Violations lists requests to the emulated services that broke the
// relay's contract with them; a benchmark or test fails on any.
func (d *Deployment) Violations() []string {
	out := d.sched.Violations()
	for name, v := range d.invokes {
		for _, p := range v.Violations() {
			out = append(out, name+": "+p)
		}
	}
	return out
}

// Logs returns the tail of every environment's output, for failure
// reports.
func (d *Deployment) Logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, e := range d.envs {
		fmt.Fprintf(&b, "== %s\n%s\n", e.id, e.log.String())
	}
	return b.String()
}

func (d *Deployment) fireResult(_, res []byte) {
	var r struct {
		Busy bool `json:"busy"`
	}
	if json.Unmarshal(res, &r) == nil && r.Busy {
		d.mu.Lock()
		d.fireBusy++
		d.mu.Unlock()
	}
}

func (d *Deployment) sweepResult(_, res []byte) {
	var r struct {
		RowsDelivered int `json:"rows_delivered"`
	}
	if json.Unmarshal(res, &r) == nil {
		d.mu.Lock()
		d.swept += r.RowsDelivered
		d.mu.Unlock()
	}
}
