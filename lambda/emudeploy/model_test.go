package emudeploy

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/scheduler"
)

// manualClock is a Clock the test moves: Advance runs every timer due by
// then, in time order, in the calling goroutine, so what the endpoints do
// at a given time is checked without waiting for it.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers []manualTimer
}

type manualTimer struct {
	at  time.Time
	seq int
	f   func()
}

var epoch = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newManualClock() *manualClock { return &manualClock{now: epoch} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.timers = append(c.timers, manualTimer{at: c.now.Add(max(d, 0)), seq: c.seq, f: f})
}

// Advance moves the clock by d, running each timer at its time.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.Slice(c.timers, func(i, j int) bool {
			if !c.timers[i].at.Equal(c.timers[j].at) {
				return c.timers[i].at.Before(c.timers[j].at)
			}
			return c.timers[i].seq < c.timers[j].seq
		})
		if len(c.timers) == 0 || c.timers[0].at.After(end) {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		c.now = t.at
		c.mu.Unlock()
		t.f()
	}
}

// Next is when the earliest timer is due (zero if none).
func (c *manualClock) Next() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, t := range c.timers {
		if next.IsZero() || t.at.Before(next) {
			next = t.at
		}
	}
	return next
}

const seed = 20261201

// TestRunAtIsUniformOverTheMinute: every run falls on a whole second of
// the 60 s window from the at() time, never before it, and each of the 60
// seconds is drawn about equally often (60,000 draws: each within 10% of
// 1,000, over 3 standard deviations for a fair die; the seed fixes the
// draws, so the test is deterministic).
func TestRunAtIsUniformOverTheMinute(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 1))
	at := epoch.Add(35 * time.Second)
	var hits [60]int
	for range 60000 {
		run := RunAt(at, DefaultPrecision, r)
		late := run.Sub(at)
		if late < 0 || late >= time.Minute || late%time.Second != 0 {
			t.Fatalf("seed %d: at %s runs at %s", seed, at, run)
		}
		hits[late/time.Second]++
	}
	for s, n := range hits {
		if n < 900 || n > 1100 {
			t.Errorf("seed %d: second %d drawn %d times of 60000, want about 1000", seed, s, n)
		}
	}
	if run := RunAt(at, time.Second, r); !run.Equal(at) {
		t.Errorf("with 1 s precision at %s runs at %s", at, run)
	}
}

// TestSchedulerRunsKicksWithinTheMinute drives the Scheduler endpoint with
// the relay's own kicker through the real SDK: the schedule runs at its
// RunAt, not a moment before, and only once; a kick for the same due
// second while it is pending is a conflict (armed), and once it ran the
// name is free again.
func TestSchedulerRunsKicksWithinTheMinute(t *testing.T) {
	clk := newManualClock()
	var ran []string
	s := NewScheduler(clk, DefaultPrecision, 0, seed, func(arn string, input []byte) {
		if arn != FireARN {
			t.Errorf("schedule targets %s", arn)
		}
		ran = append(ran, string(input))
	})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	newKicker := func() *scheduler.Kicker {
		k, err := scheduler.New(scheduler.Config{
			Client: awsscheduler.New(awsscheduler.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
				Credentials: credentials.NewStaticCredentialsProvider("relay", "relay", ""), RetryMaxAttempts: 1}),
			Group: "relay-alarms", TargetARN: FireARN, RoleARN: "arn:aws:iam::123456789012:role/relay-scheduler", Now: clk.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := newKicker()
	ctx := t.Context()
	due := clk.Now().UnixMilli()
	if err := k.Kick(ctx, "orders", due); err != nil {
		t.Fatal(err)
	}
	at := clk.Now().Add(scheduler.DefaultMinLead) // a due now is scheduled MinLead ahead
	run := clk.Next()
	if late := run.Sub(at); late < 0 || late >= time.Minute {
		t.Fatalf("seed %d: kick at(%s) runs at %s", seed, at, run)
	}
	// Another process's kick (k's own would know its schedule pending).
	if err := newKicker().Kick(ctx, "orders", due); err != nil {
		t.Fatal(err)
	}
	clk.Advance(run.Sub(clk.Now()) - time.Millisecond)
	if len(ran) != 0 || s.Pending() != 1 {
		t.Fatalf("before its run: ran %v, %d pending", ran, s.Pending())
	}
	clk.Advance(time.Millisecond)
	if len(ran) != 1 || ran[0] != `{"source":"orders"}` || s.Pending() != 0 {
		t.Fatalf("at its run: ran %v, %d pending", ran, s.Pending())
	}
	if err := k.Kick(ctx, "orders", due); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Requests != 3 || st.Created != 2 || st.Conflicts != 1 || st.Runs != 1 || st.Invalid != 0 {
		t.Errorf("stats %+v, want 3 requests: 2 created, 1 conflict; 1 run", st)
	}
	if st.Late != run.Sub(at) {
		t.Errorf("late %s, want %s", st.Late, run.Sub(at))
	}
}

// gateEnv is an environment whose invocations wait for the test: started
// receives each payload as it starts; each release lets one finish with
// result.
type gateEnv struct {
	started chan string
	release chan []byte
}

func (g *gateEnv) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	g.started <- string(payload)
	return <-g.release, nil
}

// newGated returns a function on n gated environments sharing one started
// and one release channel, and a channel that receives each finished
// invocation once its environment is idle again.
func newGated(clk Clock, a Async, n int) (*Function, *gateEnv, chan string) {
	g := &gateEnv{started: make(chan string, 64), release: make(chan []byte)}
	envs := make([]Environment, n)
	for i := range envs {
		envs[i] = g
	}
	f := NewFunction("fire", clk, a, seed, envs...)
	done := make(chan string, 64)
	f.onResult = func(p, _ []byte) { done <- string(p) }
	return f, g, done
}

// recv takes the next value from ch, failing the test if none comes: an
// invocation the model should have started never did (a guard against a
// hang, not a timing assertion).
func recv(t *testing.T, ch chan string) string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("an invocation the model should have started or finished did not")
		return ""
	}
}

func drainStarted(g *gateEnv) []string {
	var out []string
	for {
		select {
		case p := <-g.started:
			out = append(out, p)
		default:
			return out
		}
	}
}

// TestQueueDelayThenConcurrencyLimit: queued events wait their queue
// delay, at most the pool's size run at once, the rest are throttled and
// retried 1 s later (then 2 s, doubling, as Lambda documents), and every
// event runs once environments free up.
func TestQueueDelayThenConcurrencyLimit(t *testing.T) {
	clk := newManualClock()
	f, g, done := newGated(clk, Async{}, 2)
	t.Cleanup(func() { close(g.release); f.Close() })
	for _, p := range []string{"a", "b", "c", "d", "e"} {
		f.Queue([]byte(p))
	}
	clk.Advance(50*time.Millisecond - time.Nanosecond)
	if s := drainStarted(g); len(s) != 0 {
		t.Fatalf("started %v before the shortest queue delay", s)
	}
	clk.Advance(100 * time.Millisecond) // past the longest (150 ms)
	// Each taken event starts in its own goroutine: wait for the two.
	first := []string{recv(t, g.started), recv(t, g.started)}
	if st := f.Stats(); st.Invocations != 2 || st.Throttled != 3 || st.MaxConcurrent != 2 {
		t.Fatalf("after the queue delay: %+v, want 2 running and 3 throttled", st)
	}
	g.release <- []byte(`{}`)
	recv(t, done)
	clk.Advance(time.Second - 100*time.Millisecond) // before the first retries
	if st := f.Stats(); st.Invocations != 2 {
		t.Fatalf("a throttled event ran before its 1 s retry: %+v", st)
	}
	clk.Advance(time.Second)
	third := recv(t, g.started)
	st := f.Stats()
	if st.Invocations != 3 || st.Throttled != 5 || st.MaxConcurrent != 2 {
		t.Fatalf("after the first retry: %+v, want 3 invocations, 5 throttles (two events throttled again)", st)
	}
	// Release the rest one at a time; the throttled events retry 2 s, then
	// 4 s... after their last throttle, and each runs once.
	seen := map[string]int{first[0]: 1, first[1]: 1, third: 1}
	for len(seen) < 5 || f.Stats().Invocations < 5 {
		g.release <- []byte(`{}`)
		recv(t, done)
		clk.Advance(clk.Next().Sub(clk.Now()))
		for _, p := range drainStarted(g) {
			seen[p]++
		}
	}
	for p, n := range seen {
		if n != 1 {
			t.Errorf("%s ran %d times", p, n)
		}
	}
	if st := f.Stats(); st.MaxConcurrent != 2 || st.Queued != 5 || st.Invocations != 5 || st.Errors != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestFunctionErrorsRetriedThenDropped: a function error is retried
// MaxRetries times, a minute and then two minutes later; an event queued
// longer than MaxEventAge is dropped.
func TestFunctionErrorsRetriedThenDropped(t *testing.T) {
	clk := newManualClock()
	f, g, done := newGated(clk, Async{MaxRetries: 2, MaxEventAge: 10 * time.Minute}, 1)
	t.Cleanup(func() { close(g.release); f.Close() })
	f.Queue([]byte("x"))
	fail := []byte(`{"errorMessage":"boom","errorType":"error"}`)
	var starts []time.Time
	for range 3 {
		clk.Advance(clk.Next().Sub(clk.Now()))
		recv(t, g.started)
		starts = append(starts, clk.Now())
		g.release <- fail
		recv(t, done)
	}
	if next := clk.Next(); !next.IsZero() {
		t.Fatalf("a third retry is due at %s", next)
	}
	if d1, d2 := starts[1].Sub(starts[0]), starts[2].Sub(starts[1]); d1 != time.Minute || d2 != 2*time.Minute {
		t.Errorf("retries after %s and %s, want 1m and 2m", d1, d2)
	}
	if st := f.Stats(); st.Invocations != 3 || st.Errors != 3 || st.Retried != 2 {
		t.Errorf("stats %+v", st)
	}

	// Expiry: the only environment is held, so the event is throttled
	// until it is older than MaxEventAge.
	f.Queue([]byte("held"))
	clk.Advance(clk.Next().Sub(clk.Now()))
	recv(t, g.started)
	f.Queue([]byte("old"))
	for f.Stats().Expired == 0 {
		clk.Advance(clk.Next().Sub(clk.Now()))
	}
	if st := f.Stats(); st.Invocations != 4 || st.Throttled < 5 {
		t.Errorf("expired after %+v", st)
	}
	g.release <- []byte(`{}`)
	recv(t, done)
}

// TestSweepTicksEveryPeriod: the sweep's rate schedule ticks at a seeded
// phase within the first period, then exactly every period.
func TestSweepTicksEveryPeriod(t *testing.T) {
	clk := newManualClock()
	stop := make(chan struct{})
	var ticks []time.Time
	Sweep(clk, time.Minute, seed, stop, func([]byte) { ticks = append(ticks, clk.Now()) })
	clk.Advance(5*time.Minute - time.Nanosecond)
	close(stop)
	if len(ticks) != 5 {
		t.Fatalf("%d ticks in 5 minutes", len(ticks))
	}
	if phase := ticks[0].Sub(epoch); phase < 0 || phase >= time.Minute {
		t.Errorf("phase %s", phase)
	}
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != time.Minute {
			t.Errorf("tick %d after %s", i, d)
		}
	}
}

// TestInvokeQueuesOrRefuses drives the Invoke endpoint with the relay's
// continuation invoker through the real SDK: an accepted invoke is queued
// on the function, a refused one is answered with the refusal and queues
// nothing, and a synchronous invoke breaks the contract.
func TestInvokeQueuesOrRefuses(t *testing.T) {
	var queued []string
	v := NewInvoke(FireARN, 0, func(p []byte) { queued = append(queued, string(p)) })
	srv := httptest.NewServer(v)
	t.Cleanup(srv.Close)
	client := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("relay", "relay", ""), RetryMaxAttempts: 1})
	inv, err := lambdainvoke.New(lambdainvoke.Config{Client: client, FunctionARN: FireARN})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := inv.Continue(ctx, "orders", 1); err != nil {
		t.Fatal(err)
	}
	v.Refuse(http.StatusTooManyRequests)
	var throttled *lambdatypes.TooManyRequestsException
	if err := inv.Continue(ctx, "orders", 2); !errors.As(err, &throttled) {
		t.Errorf("refused invoke: %v, want TooManyRequestsException", err)
	}
	v.Refuse(0)
	_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(FireARN), Payload: []byte(`{"source":"orders"}`)})
	if err == nil {
		t.Error("a synchronous invoke was accepted")
	}
	if len(queued) != 1 || queued[0] != `{"source":"orders","hop":1}` {
		t.Errorf("queued %q", queued)
	}
	if st := v.Stats(); st.Requests != 3 || st.Accepted != 1 || st.Refused != 1 || st.Invalid != 1 || len(v.Violations()) != 1 {
		t.Errorf("stats %+v, violations %q", st, v.Violations())
	}
}

// stepEnv is an environment whose invocation takes d on its clock and
// makes n DynamoDB requests (counted in *made).
type stepEnv struct {
	clk  *manualClock
	d    time.Duration
	n    int
	made *int
}

func (e *stepEnv) Invoke(context.Context, []byte) ([]byte, error) {
	*e.made += e.n
	e.clk.Advance(e.d)
	return []byte(`{}`), nil
}

// TestInvocationsBilled: each invocation is timed on the function's clock
// and billed rounded up to the millisecond, with the DynamoDB requests its
// environment made meanwhile, for synchronous and asynchronous invokes.
func TestInvocationsBilled(t *testing.T) {
	clk := newManualClock()
	made := 0
	env := &stepEnv{clk: clk, d: 12300 * time.Microsecond, n: 3, made: &made}
	f := NewFunction("fire", clk, Async{QueueDelay: func(*rand.Rand) time.Duration { return time.Millisecond }}, seed, env)
	f.requests = func(Environment) int { return made }
	if _, err := f.Invoke(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	env.d, env.n = 40*time.Millisecond, 5
	f.Queue(nil)
	clk.Advance(time.Millisecond)
	f.Close()
	got := f.Invocations()
	want := []Invocation{{Duration: 12300 * time.Microsecond, DynamoRequests: 3}, {Duration: 40 * time.Millisecond, DynamoRequests: 5}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("invocations %+v, want %+v", got, want)
	}
	if st := f.Stats(); st.BilledMillis != 13+40 {
		t.Errorf("billed %d ms, want 53 (12.3 ms billed as 13)", st.BilledMillis)
	}
}
