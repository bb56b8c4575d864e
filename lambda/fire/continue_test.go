package fire_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

const fireARN = "arn:aws:lambda:us-east-1:123456789012:function:relay-fire"

// frozenClock never moves, so "due now" and "backed off" are exact: the
// engine re-arms at this instant after progress and strictly later after
// a fire without progress.
type frozenClock struct{ t time.Time }

func (c frozenClock) Now() time.Time { return c.t }

// withContinuation wires the handler to a recording Lambda endpoint
// through the real SDK client and lambdainvoke.Invoker.
func (e *env) withContinuation(t *testing.T, maxHops int) *invoketest.Server {
	t.Helper()
	srv := invoketest.Start(t, fireARN)
	inv, err := lambdainvoke.New(lambdainvoke.Config{Client: srv.Client(), FunctionARN: fireARN})
	if err != nil {
		t.Fatal(err)
	}
	clock := frozenClock{time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	e.clock = clock
	e.relay.Clock = clock
	e.h.Continue, e.h.MaxHops, e.h.Clock = inv, maxHops, clock
	return srv
}

// chain runs payload, then every continuation it queues, as Lambda would
// run the async invokes, until an invocation continues no further. It
// returns the results in order.
func (e *env) chain(t *testing.T, srv *invoketest.Server, payload []byte) []fire.Result {
	t.Helper()
	var out []fire.Result
	for {
		res, err := e.h.Handle(t.Context(), payload)
		if err != nil {
			t.Fatalf("hop %d: %v", len(out), err)
		}
		out = append(out, res)
		if !res.Continued {
			select {
			case inv := <-srv.C:
				t.Fatalf("hop %d did not continue but queued %+v", res.Hop, inv)
			default:
			}
			return out
		}
		if len(out) > 100 {
			t.Fatal("chain longer than 100 invocations")
		}
		inv := <-srv.C
		if inv.Hop != res.Hop+1 || inv.Source != string(e.source) {
			t.Fatalf("hop %d queued %+v, want hop %d of %s", res.Hop, inv, res.Hop+1, e.source)
		}
		payload = inv.Payload
	}
}

// TestContinuationDrainsBacklog: one scheduled invocation (hop 0) drains a
// backlog of three alarms through two continuations, without any schedule
// running; every alarm still re-arms and kicks (the fast path stays best
// effort), and the last one clears the alarm and does not continue.
func TestContinuationDrainsBacklog(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.DefaultMaxHops)
	e.enqueue(t, 40) // ceil(40/16) = 3 alarms
	results := e.chain(t, srv, []byte(`{"source":"orders"}`))
	if len(results) != 3 {
		t.Fatalf("%d invocations, want 3: %+v", len(results), results)
	}
	delivered := 0
	for i, r := range results {
		delivered += r.RowsDelivered
		if r.Hop != i || r.Busy {
			t.Errorf("invocation %d: %+v", i, r)
		}
	}
	if last := results[2]; !last.Cleared || last.Continued {
		t.Errorf("last invocation %+v, want cleared and not continued", last)
	}
	if delivered != 40 {
		t.Errorf("%d rows delivered, want 40", delivered)
	}
	if k := e.kicks.list(); len(k) != 2 {
		t.Errorf("kicks %v, want one per re-arm (2): continuation does not replace the schedule", k)
	}
	if st := srv.Stats(); st.Accepted != 2 {
		t.Errorf("lambda endpoint %+v, want 2 async invokes", st)
	}
}

// TestContinuationStopsAtMaxHops: with MaxHops 2 a chain is three alarms;
// the third re-arms and kicks but does not invoke, and the schedule it
// armed (a hop-0 event) starts a new chain that finishes the drain.
func TestContinuationStopsAtMaxHops(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, 2)
	e.enqueue(t, 100) // 7 alarms
	first := e.chain(t, srv, []byte(`{"source":"orders"}`))
	if len(first) != 3 {
		t.Fatalf("first chain %d invocations, want 3 (hops 0..2): %+v", len(first), first)
	}
	last := first[2]
	if last.Continued || last.Cleared || last.NextDueMS == 0 {
		t.Fatalf("hop 2: %+v, want re-armed, not continued", last)
	}
	kicks := e.kicks.list()
	if kicks[len(kicks)-1] != fmt.Sprintf("orders@%d", last.NextDueMS) {
		t.Errorf("kicks %v: the last alarm of the chain must kick its schedule", kicks)
	}
	// The schedule runs: a new chain from hop 0.
	second := e.chain(t, srv, []byte(`{"source":"orders"}`))
	third := e.chain(t, srv, []byte(`{"source":"orders"}`))
	if len(second) != 3 || len(third) != 1 || !third[0].Cleared {
		t.Errorf("second chain %d, third %d invocations (%+v), want 3 then 1 that clears", len(second), len(third), third)
	}
	for _, inv := range srv.Accepted() {
		if inv.Hop > 2 {
			t.Errorf("continuation with hop %d beyond MaxHops 2", inv.Hop)
		}
	}
}

// failingTarget refuses every batch for targets at or above from, like
// target partitions that are down.
type failingTarget struct {
	relaycore.Store
	from relaycore.Partition
}

func (f failingTarget) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if p >= f.from {
		return errors.New("target unavailable")
	}
	return f.Store.Apply(ctx, p, b)
}

// TestBackoffNeverContinues: an alarm whose last fire made no progress
// re-arms after a back-off; it is not due yet and must not continue,
// however many hops remain, even when an earlier fire of the same alarm
// delivered rows.
func TestBackoffNeverContinues(t *testing.T) {
	for name, tc := range map[string]struct {
		from          relaycore.Partition
		wantDelivered int
	}{
		"nothing delivered":              {from: "t000", wantDelivered: 0},
		"first fire delivered, then not": {from: "t008", wantDelivered: 8},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, "free")
			srv := e.withContinuation(t, fire.MaxContinuationHops)
			e.relay.Target = failingTarget{Store: e.tgt, from: tc.from}
			e.enqueue(t, 16) // one free alarm: two fires of 8 targets
			res := e.fire(t)
			if res.Continued || res.RowsDelivered != tc.wantDelivered || res.NextDueMS <= e.clock.Now().UnixMilli() {
				t.Fatalf("%+v, want %d rows delivered and a backed-off re-arm without continuation", res, tc.wantDelivered)
			}
			if st := srv.Stats(); st.Requests != 0 {
				t.Errorf("a backed-off alarm invoked the function: %+v", st)
			}
		})
	}
}

// TestBusyNeverContinues: an overlapping duplicate steps aside as busy and
// does not continue; only the invocation that did the work may.
func TestBusyNeverContinues(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.DefaultMaxHops)
	e.tgt.gate, e.tgt.entered = make(chan struct{}), make(chan struct{})
	e.enqueue(t, 20) // two alarms: the first continues
	first := make(chan fire.Result, 1)
	go func() {
		res, err := e.h.Handle(context.Background(), []byte(`{"source":"orders"}`))
		if err != nil {
			t.Errorf("first fire: %v", err)
		}
		first <- res
	}()
	<-e.tgt.entered
	dup := e.fire(t)
	if !dup.Busy || dup.Continued {
		t.Errorf("overlapping duplicate %+v, want busy and not continued", dup)
	}
	close(e.tgt.gate)
	if res := <-first; !res.Continued {
		t.Errorf("first fire %+v, want it to continue", res)
	}
	if n := len(srv.Accepted()); n != 1 {
		t.Errorf("%d continuations, want 1 (from the working invocation only)", n)
	}
}

// TestContinuationFailureIsBestEffort: a throttled invoke is logged, not
// returned (retrying the whole alarm would waste a fire); the alarm's
// schedule was kicked regardless.
func TestContinuationFailureIsBestEffort(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.DefaultMaxHops)
	srv.Fail(http.StatusTooManyRequests)
	e.enqueue(t, 20)
	res := e.fire(t)
	if res.Continued || res.Cleared || res.NextDueMS == 0 {
		t.Errorf("result %+v, want re-armed and not continued", res)
	}
	if k := e.kicks.list(); len(k) != 1 {
		t.Errorf("kicks %v, want the re-arm's kick", k)
	}
	if st := srv.Stats(); st.Failed != 1 {
		t.Errorf("lambda endpoint %+v, want one refused invoke", st)
	}
}

// TestContinuationOff: no Continuer, or MaxHops 0, never invokes.
func TestContinuationOff(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, 0)
	e.enqueue(t, 40)
	if res := e.fire(t); res.Continued {
		t.Errorf("MaxHops 0: %+v continued", res)
	}
	e.h.Continue, e.h.MaxHops = nil, fire.DefaultMaxHops
	if res := e.fire(t); res.Continued {
		t.Errorf("no Continuer: %+v continued", res)
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Errorf("lambda endpoint %+v", st)
	}
}

// TestHopAtLimitDoesNotContinue: an event at MaxContinuationHops runs its
// alarm but never continues, even with a larger MaxHops configured.
func TestHopAtLimitDoesNotContinue(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.MaxContinuationHops+10)
	e.enqueue(t, 40)
	res, err := e.h.Handle(t.Context(), []byte(fmt.Sprintf(`{"source":"orders","hop":%d}`, fire.MaxContinuationHops)))
	if err != nil || res.Continued || res.RowsDelivered != 16 || res.Hop != fire.MaxContinuationHops {
		t.Errorf("result %+v, %v: want 16 rows delivered and no continuation", res, err)
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Errorf("lambda endpoint %+v", st)
	}
}

func TestHopValidation(t *testing.T) {
	for name, payload := range map[string]string{
		"negative":       `{"source":"orders","hop":-1}`,
		"above limit":    fmt.Sprintf(`{"source":"orders","hop":%d}`, fire.MaxContinuationHops+1),
		"string":         `{"source":"orders","hop":"1"}`,
		"fraction":       `{"source":"orders","hop":1.5}`,
		"huge":           `{"source":"orders","hop":1e30}`,
		"unknown fields": `{"source":"orders","hop":1,"hops":2}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := fire.ParseEvent([]byte(payload))
			if !errors.Is(err, event.ErrInvalidEvent) {
				t.Errorf("%s: err = %v, want an invalid event", payload, err)
			}
		})
	}
	ev, src, err := fire.ParseEvent([]byte(`{"source":"orders","hop":3}`))
	if err != nil || ev.Hop != 3 || src != "orders" {
		t.Errorf("valid continuation: %+v %q %v", ev, src, err)
	}
}

func TestShouldContinue(t *testing.T) {
	const now = 1_000_000
	for name, tc := range map[string]struct {
		ar   relaycore.AlarmResult
		want bool
	}{
		"progress, due now":       {relaycore.AlarmResult{Fires: 2, RowsDelivered: 16, Progress: true, NextDueMS: now}, true},
		"progress, due earlier":   {relaycore.AlarmResult{Fires: 2, RowsDelivered: 16, Progress: true, NextDueMS: now - 40}, true},
		"only cleaned rows":       {relaycore.AlarmResult{Fires: 1, RowsCleaned: 3, Progress: true, NextDueMS: now}, true},
		"cursor past blocked":     {relaycore.AlarmResult{Fires: 1, Progress: true, NextDueMS: now}, true},
		"backed off":              {relaycore.AlarmResult{Fires: 2, RowsDelivered: 8, NextDueMS: now + 250}, false},
		"rows moved, last idle":   {relaycore.AlarmResult{Fires: 2, RowsDelivered: 8, NextDueMS: now}, false},
		"nothing moved":           {relaycore.AlarmResult{Fires: 1, NextDueMS: now}, false},
		"busy":                    {relaycore.AlarmResult{Fires: 1, Busy: true}, false},
		"cleared":                 {relaycore.AlarmResult{Fires: 1, RowsDelivered: 3, Progress: true, Cleared: true}, false},
		"re-arm left to enqueuer": {relaycore.AlarmResult{Fires: 2, RowsDelivered: 16, Progress: true}, false},
	} {
		if got := fire.ShouldContinue(tc.ar, now); got != tc.want {
			t.Errorf("%s: ShouldContinue(%+v) = %v, want %v", name, tc.ar, got, tc.want)
		}
	}
}
