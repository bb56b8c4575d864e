package emudeploy

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"time"
)

// Environment is one execution environment of a function: it runs one
// invocation at a time and answers the handler's result. A function error
// (the handler or the runtime failed) is a result carrying errorMessage,
// as Lambda returns it; an error is the environment itself failing.
type Environment interface {
	Invoke(ctx context.Context, payload []byte) ([]byte, error)
}

// Async is the asynchronous invocation model of a function
// (docs/benchmarks.md, "Emulated deployment"), as Lambda documents it in
// its developer guide ("Asynchronous invocation"): an accepted event waits
// in the function's queue until a poller takes it; an event taken while
// every execution environment the function may use is busy is throttled
// and returned to the queue, and tried again after 1 s, then at intervals
// doubling up to 5 minutes; a function error is retried MaxRetries times,
// 1 minute then 2 minutes later; an event older than MaxEventAge is
// dropped.
type Async struct {
	// QueueDelay draws the time from acceptance to the first time a poller
	// takes the event. Lambda publishes no figure for it (its
	// AsyncEventAge metric measures it per function); see DefaultQueueDelay.
	QueueDelay func(*rand.Rand) time.Duration
	// MaxEventAge drops events still queued this long after acceptance
	// (EventInvokeConfig MaximumEventAgeInSeconds); 0 is Lambda's default,
	// 6 hours.
	MaxEventAge time.Duration
	// MaxRetries is EventInvokeConfig MaximumRetryAttempts (0 to 2).
	MaxRetries int
}

// DefaultQueueDelay draws uniformly from 50 to 150 ms: the 100 ms async
// launch the cost benchmark (lambda/bench) assumes, within the "tens to
// hundreds of milliseconds" docs/deploy.md gives, with jitter so that
// events queued together are not taken together.
func DefaultQueueDelay(r *rand.Rand) time.Duration {
	return 50*time.Millisecond + time.Duration(r.Int64N(int64(100*time.Millisecond)))
}

// Lambda's documented retry intervals: throttled events are retried from
// 1 s, doubling, up to 5 minutes; function errors 1 minute, then 2 minutes
// after the first retry.
const (
	throttleFirst = time.Second
	throttleMax   = 5 * time.Minute
	errorRetry    = time.Minute
	defaultMaxAge = 6 * time.Hour
)

// FunctionStats counts one function's invocations.
type FunctionStats struct {
	// Queued events were accepted for asynchronous invocation.
	Queued int
	// Invocations started in an environment: each is a billed Lambda
	// request.
	Invocations int
	// Throttled attempts found every environment busy; the event went back
	// to the queue.
	Throttled int
	// Errors are invocations that answered a function error or whose
	// environment failed; Retried of them were queued again; Expired
	// events were dropped for age.
	Errors, Retried, Expired int
	// MaxConcurrent is the most invocations that ran at once.
	MaxConcurrent int
	// BilledMillis sums the invocations' billed durations
	// (Invocation.BilledMillis).
	BilledMillis int64
}

// Invocation is one invocation as Lambda bills it: how long the
// environment took to answer it, timed around its Invoke on the
// function's clock (wall time for a bootstrap under the runtime emulator,
// virtual time in process), and the DynamoDB requests it made (counted by
// the DynamoDB endpoint under the environment's own access key).
type Invocation struct {
	Duration       time.Duration
	DynamoRequests int
}

// BilledMillis is the invocation's duration rounded up to the millisecond,
// as Lambda bills it.
func (i Invocation) BilledMillis() int64 {
	return int64((i.Duration + time.Millisecond - 1) / time.Millisecond)
}

// Function is an emulated Lambda function: a fixed pool of execution
// environments (its reserved concurrency) and an asynchronous queue in
// front of them.
type Function struct {
	name  string
	clk   Clock
	async Async
	idle  chan Environment
	// onResult, when set, sees every invocation's result (not for
	// environment failures).
	onResult func(payload, result []byte)
	// requests, when set, is the DynamoDB requests an environment has
	// made so far (Invocation.DynamoRequests).
	requests func(Environment) int

	mu      sync.Mutex
	rng     *rand.Rand
	stats   FunctionStats
	invs    []Invocation
	running int
	closed  bool
	wg      sync.WaitGroup
}

// NewFunction returns a function running on envs (at most len(envs)
// invocations at once) with the async model a; seed seeds its delays.
func NewFunction(name string, clk Clock, a Async, seed uint64, envs ...Environment) *Function {
	if a.QueueDelay == nil {
		a.QueueDelay = DefaultQueueDelay
	}
	if a.MaxEventAge == 0 {
		a.MaxEventAge = defaultMaxAge
	}
	f := &Function{name: name, clk: clk, async: a, idle: make(chan Environment, len(envs)), rng: rand.New(rand.NewPCG(seed, 0x656d75))}
	for _, e := range envs {
		f.idle <- e
	}
	return f
}

// Stats returns the counters.
func (f *Function) Stats() FunctionStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Invocations returns every invocation that ended, in the order they
// ended.
func (f *Function) Invocations() []Invocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Invocation(nil), f.invs...)
}

// run invokes env and records the invocation.
func (f *Function) run(ctx context.Context, env Environment, payload []byte) ([]byte, error) {
	before := 0
	if f.requests != nil {
		before = f.requests(env)
	}
	start := f.clk.Now()
	res, err := env.Invoke(ctx, payload)
	inv := Invocation{Duration: f.clk.Now().Sub(start)}
	if f.requests != nil {
		inv.DynamoRequests = f.requests(env) - before
	}
	f.mu.Lock()
	f.invs = append(f.invs, inv)
	f.stats.BilledMillis += inv.BilledMillis()
	f.mu.Unlock()
	return res, err
}

// Queue accepts an event for asynchronous invocation, as Invoke with
// InvocationType Event does: it returns at once, and a poller takes the
// event after the queue delay.
func (f *Function) Queue(payload []byte) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.stats.Queued++
	d := f.async.QueueDelay(f.rng)
	f.mu.Unlock()
	ev := &queued{payload: payload, accepted: f.clk.Now()}
	f.clk.AfterFunc(d, func() { f.take(ev) })
}

// queued is an accepted event and its attempts so far.
type queued struct {
	payload   []byte
	accepted  time.Time
	throttles int // throttled attempts in a row
	retries   int // function errors retried
}

// take is a poller taking ev from the queue: it runs ev in an idle
// environment, or returns it to the queue for later.
func (f *Function) take(ev *queued) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if f.clk.Now().Sub(ev.accepted) > f.async.MaxEventAge {
		f.stats.Expired++
		return
	}
	var env Environment
	select {
	case env = <-f.idle:
	default:
		f.stats.Throttled++
		wait := min(throttleFirst<<min(ev.throttles, 16), throttleMax)
		ev.throttles++
		f.clk.AfterFunc(wait, func() { f.take(ev) })
		return
	}
	ev.throttles = 0
	f.startLocked()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		res, err := f.run(context.Background(), env, ev.payload)
		f.idle <- env
		f.finish(ev, err != nil || functionError(res))
		// Only after the bookkeeping: an observer told of the result must
		// find the stats counted and a retry already on the clock.
		if err == nil && f.onResult != nil {
			f.onResult(ev.payload, res)
		}
	}()
}

// finish accounts for ev's invocation: it is no longer running and, when
// it failed, its error is counted and a retry armed while retries remain.
func (f *Function) finish(ev *queued, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running--
	if !failed {
		return
	}
	f.stats.Errors++
	if ev.retries < f.async.MaxRetries && !f.closed {
		ev.retries++
		f.stats.Retried++
		f.clk.AfterFunc(time.Duration(ev.retries)*errorRetry, func() { f.take(ev) })
	}
}

func (f *Function) startLocked() {
	f.stats.Invocations++
	f.running++
	f.stats.MaxConcurrent = max(f.stats.MaxConcurrent, f.running)
}

// Invoke runs payload synchronously (InvocationType RequestResponse, as a
// function URL does) in the next idle environment, waiting for one.
func (f *Function) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	var env Environment
	select {
	case env = <-f.idle:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	f.startLocked()
	f.mu.Unlock()
	res, err := f.run(ctx, env, payload)
	f.idle <- env
	f.mu.Lock()
	f.running--
	if err != nil || functionError(res) {
		f.stats.Errors++
	}
	f.mu.Unlock()
	if err == nil && f.onResult != nil {
		f.onResult(payload, res)
	}
	return res, err
}

// Close stops taking events and waits for the invocations that run.
func (f *Function) Close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
}

// functionError reports whether a result is Lambda's function error shape.
func functionError(res []byte) bool {
	var e struct {
		ErrorMessage *string `json:"errorMessage"`
	}
	return json.Unmarshal(res, &e) == nil && e.ErrorMessage != nil
}
