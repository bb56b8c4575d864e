package fire_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// stepClock is a clock the test moves: stepAlarms advances it after every
// alarm, so an invocation's slice runs out after a known number of them.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// stepAlarms is the relay with each alarm taking step on the clock.
type stepAlarms struct {
	relay *relaycore.RelayHandler
	clock *stepClock
	step  time.Duration
}

func (s stepAlarms) Alarm(ctx context.Context, src relaycore.Partition) (relaycore.AlarmResult, error) {
	ar, err := s.relay.Alarm(ctx, src)
	s.clock.advance(s.step)
	return ar, err
}

// withSteps gives e a clock that alarms advance by step and a DrainSlice.
func (e *env) withSteps(t *testing.T, step, slice time.Duration) *stepClock {
	t.Helper()
	c := &stepClock{t: time.Now().Add(time.Hour)}
	e.clock, e.relay.Clock, e.h.Clock = c, c, c
	e.h.Relay, e.h.DrainSlice = stepAlarms{relay: e.relay, clock: c, step: step}, slice
	return c
}

// TestDrainSliceRunsAlarmsInProcess: an invocation whose alarm continues
// runs the next alarm itself while its slice lasts, and queues the next
// hop only when the slice is spent. 100 rows into 100 targets are 7 Free
// alarms; at 1 s an alarm and a 2.5 s slice an invocation runs 3 of them
// (the third starts at 2 s), so the chain is 3 + 3 + 1 alarms in three
// invocations, not seven. Every alarm still re-arms and kicks its
// schedule, as with one alarm per invocation.
func TestDrainSliceRunsAlarmsInProcess(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.DefaultMaxHops)
	e.withSteps(t, time.Second, 2500*time.Millisecond)
	e.enqueue(t, 100)
	results := e.chain(t, srv, []byte(`{"source":"orders"}`))
	var alarms []int
	delivered, fires := 0, 0
	for _, r := range results {
		alarms = append(alarms, r.Alarms)
		delivered += r.RowsDelivered
		fires += r.Fires
	}
	if len(alarms) != 3 || alarms[0] != 3 || alarms[1] != 3 || alarms[2] != 1 {
		t.Fatalf("alarms per invocation %v, want [3 3 1]", alarms)
	}
	if delivered != 100 || fires != 13 || !results[2].Cleared {
		t.Errorf("delivered %d rows in %d fires, last %+v: want 100 in 13 (2 per alarm, 1 for the last 4 rows), cleared", delivered, fires, results[2])
	}
	if k := e.kicks.list(); len(k) != 6 {
		t.Errorf("kicks %v, want one per re-arm (6)", k)
	}
	if st := srv.Stats(); st.Accepted != 2 {
		t.Errorf("lambda endpoint %+v, want 2 async invokes", st)
	}
}

// TestDrainSliceLeavesRoomBeforeTheDeadline: with less than three of its
// longest alarms left before the invocation's deadline, the invocation
// hands over to the next hop even within its slice.
func TestDrainSliceLeavesRoomBeforeTheDeadline(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, fire.DefaultMaxHops)
	c := e.withSteps(t, time.Second, time.Hour)
	e.enqueue(t, 100)
	// 5 s to the deadline and 1 s an alarm: 4 s are left after the first
	// alarm and 3 s after the second (not less than three alarms: it runs
	// a third), 2 s after the third, when it hands over.
	ctx, cancel := context.WithDeadline(t.Context(), c.Now().Add(5*time.Second))
	defer cancel()
	res, err := e.h.Handle(ctx, []byte(`{"source":"orders"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res.Alarms != 3 || !res.Continued {
		t.Fatalf("%+v: want 3 alarms, then a hop", res)
	}
	if st := srv.Stats(); st.Accepted != 1 {
		t.Errorf("lambda endpoint %+v, want 1 async invoke", st)
	}
}

// TestDrainSliceNeedsContinuation: with continuation off (MaxHops 0) an
// invocation runs one alarm whatever its slice, as a `sam local invoke`
// with CONTINUATION_HOPS 0 does; at the hop limit it drains for its slice
// and then stops, the schedule starting the next chain.
func TestDrainSliceNeedsContinuation(t *testing.T) {
	e := newEnv(t, "free")
	srv := e.withContinuation(t, 0)
	e.withSteps(t, time.Second, time.Hour)
	e.enqueue(t, 100)
	if res := e.fire(t); res.Alarms != 1 || res.Continued {
		t.Errorf("MaxHops 0: %+v, want one alarm", res)
	}
	e.h.MaxHops = 2
	e.h.DrainSlice = 2500 * time.Millisecond
	res, err := e.h.Handle(t.Context(), []byte(`{"source":"orders","hop":2}`))
	if err != nil || res.Alarms != 3 || res.Continued || res.Cleared {
		t.Errorf("hop 2 of 2: %+v, %v: want 3 alarms, no hop, not cleared", res, err)
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Errorf("lambda endpoint %+v", st)
	}
}
