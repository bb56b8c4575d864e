package alarmclock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// waitDrained runs the clock until every source's outbox is empty, observing
// after each alarm; the context deadline only guards against a hang.
func waitDrained(t *testing.T, c *alarmclock.Clock, st relaycore.Store, sources []relaycore.Partition, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		drained := true
		for _, s := range sources {
			state, err := relaycore.SourceRelayState(ctx, st, s, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			drained = drained && state.Empty
		}
		if drained {
			return
		}
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("outboxes not drained: %v (clock stats %+v)", ctx.Err(), c.Stats())
		}
	}
}

func enqueue(t *testing.T, st relaycore.Store, kicker relaycore.Kicker, source relaycore.Partition, n int) {
	t.Helper()
	rows := make([]relaycore.Row, n)
	for i := range rows {
		rows[i] = relaycore.Row{
			Target: relaycore.Partition(fmt.Sprintf("t%d", i%5)),
			Puts:   []relaycore.KV{{Key: fmt.Sprintf("k%d", i), Value: []byte(fmt.Sprintf("%s-%d", source, i))}},
		}
	}
	h := &relaycore.RelayHandler{Source: st, Clock: relaycore.SystemClock{}, Kicker: kicker}
	if _, err := h.Enqueue(context.Background(), source, rows, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
}

func newClock(src, dst relaycore.Store, index relaycore.DueIndex) (*alarmclock.Clock, *relaycore.RelayHandler, chan struct{}) {
	h := &relaycore.RelayHandler{Source: src, Target: dst}
	observed := make(chan struct{}, 1024)
	c := alarmclock.New(alarmclock.Config{
		Handler: h,
		Index:   index,
		Observe: func(relaycore.Partition, relaycore.AlarmResult, error) {
			select {
			case observed <- struct{}{}:
			default:
			}
		},
	})
	h.Kicker = c
	return c, h, observed
}

// A kick after commit wakes the source's alarm and the rows are delivered.
func TestKickDelivers(t *testing.T) {
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	c, _, observed := newClock(src, dst, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	sources := []relaycore.Partition{"a", "b"}
	for _, s := range sources {
		enqueue(t, src, c, s, 40)
	}
	waitDrained(t, c, src, sources, observed)
	for i := range 40 {
		v, ok, err := dst.Get(ctx, relaycore.Partition(fmt.Sprintf("t%d", i%5)), fmt.Sprintf("k%d", i))
		if err != nil || !ok {
			t.Fatalf("k%d missing at target: %v", i, err)
		}
		if string(v) != fmt.Sprintf("b-%d", i) && string(v) != fmt.Sprintf("a-%d", i) {
			t.Fatalf("k%d = %q", i, v)
		}
	}
	if st := c.Stats(); st.Kicks == 0 || st.Alarms == 0 {
		t.Fatalf("no kicks or alarms recorded: %+v", st)
	}
}

// With every kick lost, the sweep over the durable alarm records (the
// safety net) still delivers everything.
func TestSweepHealsLostKick(t *testing.T) {
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	sources := []relaycore.Partition{"a", "b", "c"}
	for _, s := range sources {
		enqueue(t, src, nil, s, 25) // no kicker: the fast path is lost
	}
	c, h, observed := newClock(src, dst, src)
	h.Kicker = nil // re-arms are lost too; only the sweep remains
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	waitDrained(t, c, src, sources, observed)
	if st := c.Stats(); st.SweepFound < int64(len(sources)) {
		t.Fatalf("sweep found %d alarms, want >= %d", st.SweepFound, len(sources))
	}
}

// fixedClock reads one instant.
type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

// A new process's first sweep also schedules the alarms due before its
// second sweep: an alarm armed for 2 s later (a back-off whose timer died
// with the previous process) fires then, not a sweep period late.
func TestFirstSweepLooksAhead(t *testing.T) {
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	later := &relaycore.RelayHandler{Source: src, Clock: fixedClock(time.Now().Add(2 * time.Second))}
	if _, err := later.Enqueue(context.Background(), "a", []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	h := &relaycore.RelayHandler{Source: src, Target: dst}
	observed := make(chan struct{}, 1024)
	c := alarmclock.New(alarmclock.Config{
		Handler: h, Index: src, Source: src, SweepInterval: time.Hour,
		Observe: func(relaycore.Partition, relaycore.AlarmResult, error) { observed <- struct{}{} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	waitDrained(t, c, src, []relaycore.Partition{"a"}, observed)
}

// Kicks for one source collapse to the earliest; a later kick does not
// postpone an earlier one.
func TestKicksCollapse(t *testing.T) {
	c := alarmclock.New(alarmclock.Config{Handler: &relaycore.RelayHandler{}})
	ctx := context.Background()
	_ = c.Kick(ctx, "s", 500)
	_ = c.Kick(ctx, "s", 900)
	_ = c.Kick(ctx, "s", 300)
	due, ok := c.NextDue()
	if !ok || due != 300 {
		t.Fatalf("next due = %d, %v; want 300", due, ok)
	}
	if c.Idle() {
		t.Fatal("clock with a pending kick reports idle")
	}
}

// failingIndex is a due index whose listing always fails.
type failingIndex struct{}

func (failingIndex) Due(context.Context, int64, int) ([]relaycore.DueEntry, error) {
	return nil, errors.New("index unavailable")
}

// A sweep that cannot list the due index is reported to ObserveSweep and
// counted, so a server can export it as a metric; one that can reports
// what it found.
func TestObserveSweep(t *testing.T) {
	type sweep struct {
		found int
		err   error
	}
	for _, tc := range []struct {
		name      string
		index     func(src *mem.Store) relaycore.DueIndex
		wantFound int
		wantErr   bool
	}{
		{"failing index", func(*mem.Store) relaycore.DueIndex { return failingIndex{} }, 0, true},
		{"overdue alarm", func(src *mem.Store) relaycore.DueIndex { return src }, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := mem.New(relaycore.Capabilities{})
			enqueue(t, src, nil, "a", 1)
			sweeps := make(chan sweep, 16)
			c := alarmclock.New(alarmclock.Config{
				Handler: &relaycore.RelayHandler{Source: src, Target: mem.New(relaycore.Capabilities{})},
				Index:   tc.index(src),
				ObserveSweep: func(found int, err error) {
					sweeps <- sweep{found, err}
				},
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { c.Run(ctx); close(done) }()
			s := <-sweeps // Run sweeps once at start
			cancel()
			<-done
			if s.found != tc.wantFound || (s.err != nil) != tc.wantErr {
				t.Fatalf("sweep observed found=%d err=%v; want found=%d, error %v", s.found, s.err, tc.wantFound, tc.wantErr)
			}
			if got := c.Stats().SweepErrors; (got > 0) != tc.wantErr {
				t.Fatalf("SweepErrors = %d", got)
			}
		})
	}
}

// A source whose claim was left by a process that died (kill -9 mid-fire)
// is delivered when that claim lapses, not at the next sweep: the alarm
// that met the claim asks the clock to run it again at the claim's expiry.
// The sweep here never comes (an hour), so without that the rows would
// wait.
func TestBusyAlarmRetriedWhenClaimLapses(t *testing.T) {
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	dead := relaycore.RelayState{Version: 1, Claim: &relaycore.Claim{Owner: "dead", UntilMS: time.Now().Add(300 * time.Millisecond).UnixMilli()}}
	raw, err := json.Marshal(dead)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Apply(context.Background(), "a", relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: raw}}}); err != nil {
		t.Fatal(err)
	}
	h := &relaycore.RelayHandler{Source: src, Target: dst}
	var busy atomic.Int64
	observed := make(chan struct{}, 1024)
	c := alarmclock.New(alarmclock.Config{
		Handler:       h,
		Index:         src,
		SweepInterval: time.Hour,
		Observe: func(_ relaycore.Partition, res relaycore.AlarmResult, _ error) {
			if res.Busy {
				busy.Add(1)
			}
			select {
			case observed <- struct{}{}:
			default:
			}
		},
	})
	h.Kicker = c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	enqueue(t, src, c, "a", 5)
	waitDrained(t, c, src, []relaycore.Partition{"a"}, observed)
	if busy.Load() == 0 {
		t.Fatal("no alarm met the dead claim")
	}
}

// blockingIndex answers Due only when the call's context ends, with its
// error: a sweep under way when Run stops.
type blockingIndex struct{ called chan struct{} }

func (b blockingIndex) Due(ctx context.Context, _ int64, _ int) ([]relaycore.DueEntry, error) {
	select {
	case b.called <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A sweep cut short because Run is stopping is not a failed sweep: no
// SweepErrors, no ObserveSweep error, no WARN (before, a clean stop
// counted one about every other time).
func TestStopIsNotASweepError(t *testing.T) {
	idx := blockingIndex{called: make(chan struct{}, 1)}
	var observed []error
	var mu sync.Mutex
	c := alarmclock.New(alarmclock.Config{
		Handler: &relaycore.RelayHandler{Source: mem.New(relaycore.Capabilities{}), Target: mem.New(relaycore.Capabilities{})},
		Index:   idx,
		ObserveSweep: func(_ int, err error) {
			mu.Lock()
			observed = append(observed, err)
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	<-idx.called // the first sweep is listing the due index
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if got := c.Stats().SweepErrors; got != 0 || len(observed) != 0 {
		t.Fatalf("SweepErrors %d, observed %v after a stop during a sweep; want none", got, observed)
	}
}
