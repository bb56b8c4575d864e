package alarmclock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// slowTarget is a real target store whose batches take step of the
// manual clock each (the fire's duration, on manual time); onApply, when
// set, runs before the first of them (rows arriving during a fire), and
// fail, when set, refuses every batch (a fire without progress).
type slowTarget struct {
	relaycore.Store
	now  *manualClock
	step time.Duration

	mu      sync.Mutex
	onApply func()
	fail    bool
}

func (s *slowTarget) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	s.mu.Lock()
	f, fail := s.onApply, s.fail
	s.onApply = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	s.now.Set(s.now.Now().Add(s.step))
	if fail {
		return errors.New("target refuses the batch")
	}
	return s.Store.Apply(ctx, p, b)
}

// lingerRig is one clock with Linger set, on a source and a slow target,
// delivering one row per target in order, stepped on manual time.
type lingerRig struct {
	t     *testing.T
	now   *manualClock
	src   relaycore.Store
	dst   *slowTarget
	h     *relaycore.RelayHandler
	clock *alarmclock.Clock
	sent  int
}

func newLingerRig(t *testing.T, linger float64, maxLinger time.Duration) *lingerRig {
	now := &manualClock{t: time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)}
	r := &lingerRig{t: t, now: now, src: mem.New(relaycore.Capabilities{})}
	r.dst = &slowTarget{Store: mem.New(relaycore.Capabilities{}), now: now, step: 40 * time.Millisecond}
	r.h = &relaycore.RelayHandler{Source: r.src, Target: r.dst, Clock: now, DeliverConcurrency: 1}
	r.clock = alarmclock.New(alarmclock.Config{Handler: r.h, Clock: now, Linger: linger, MaxLinger: maxLinger})
	r.h.Kicker = r.clock
	return r
}

// enqueue sends n rows to source s, to two targets.
func (r *lingerRig) enqueue(n int) {
	r.t.Helper()
	rows := rowsFor("s", r.sent+n)[r.sent:]
	r.sent += n
	if _, err := r.h.Enqueue(context.Background(), "s", rows, relaycore.EnqueueOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// fire runs the wake-up due now and reports how long (manual time) it took.
func (r *lingerRig) fire() time.Duration {
	r.t.Helper()
	start := r.now.Now()
	if !r.clock.RunNext(context.Background()) {
		r.t.Fatalf("no wake-up due at %v (next: %v)", start, r.next())
	}
	return r.now.Now().Sub(start)
}

func (r *lingerRig) next() int64 {
	due, ok := r.clock.NextDue()
	if !ok {
		return -1
	}
	return due
}

// A source whose fire made progress while rows kept coming fires again
// Linger times that fire's duration later, not at once: the hold is the
// whole of its effect (a later fire carries the rows of both), and it
// neither delays the source's first fire nor outlasts MaxLinger.
func TestLingerHoldsABusySourcesNextFire(t *testing.T) {
	r := newLingerRig(t, 2, time.Second)
	r.enqueue(2)
	if due := r.next(); due != r.now.Now().UnixMilli() {
		t.Fatalf("first wake-up at %d; want at once (%d): a quiet source's first fire is never held", due, r.now.Now().UnixMilli())
	}
	r.dst.onApply = func() { r.enqueue(4) } // rows arrive while it fires
	took := r.fire()
	if took != 80*time.Millisecond {
		t.Fatalf("the fire took %v of manual time; want two batches of 40ms", took)
	}
	end := r.now.Now().UnixMilli()
	if due, want := r.next(), end+(2*took).Milliseconds(); due != want {
		t.Fatalf("next wake-up at %d; want the fire's end %d plus twice its %v (%d)", due, end, took, want)
	}
	if st := r.clock.Stats(); st.Lingered != 1 {
		t.Fatalf("stats %+v; want one lingered fire", st)
	}
	if r.clock.RunNext(context.Background()) {
		t.Fatal("the held source fired before its hold ended")
	}
	r.now.Set(time.UnixMilli(r.next()))
	r.fire() // the 4 rows that came during the first fire, in one fire
	checkDelivered(t, shared{src: r.src, dst: r.dst.Store}, []relaycore.Partition{"s"}, 6)
	if due := r.next(); due != -1 {
		t.Fatalf("a drained source still has a wake-up at %d", due)
	}
	if st := r.clock.Stats(); st.Lingered != 1 || st.Alarms != 2 {
		t.Fatalf("stats %+v; want 2 alarms, one lingered (the second left nothing to hold)", st)
	}
}

func TestLingerCappedAtMaxLinger(t *testing.T) {
	r := newLingerRig(t, 2, 100*time.Millisecond)
	r.enqueue(2)
	r.dst.onApply = func() { r.enqueue(2) }
	r.fire()
	if due, want := r.next(), r.now.Now().UnixMilli()+100; due != want {
		t.Fatalf("next wake-up at %d; want MaxLinger after the fire (%d)", due, want)
	}
}

// Without Linger a busy source fires again at once (the re-arm's kick).
func TestNoLingerFiresAgainAtOnce(t *testing.T) {
	r := newLingerRig(t, 0, 0)
	r.enqueue(2)
	r.dst.onApply = func() { r.enqueue(2) }
	r.fire()
	if due, now := r.next(), r.now.Now().UnixMilli(); due < 0 || due > now {
		t.Fatalf("next wake-up at %d; want one due at once (by %d)", due, now)
	}
	if st := r.clock.Stats(); st.Lingered != 0 {
		t.Fatalf("stats %+v; want nothing lingered", st)
	}
}

// A fire that made no progress is followed by its back-off, unchanged:
// the hold is for fires that delivered. (A hold of 1000 fires, 40 s here,
// would outlast the first back-off.)
func TestLingerLeavesBackoffAlone(t *testing.T) {
	r := newLingerRig(t, 1000, time.Hour)
	r.enqueue(2)
	r.dst.fail = true
	start := r.now.Now().UnixMilli()
	r.fire()
	chk, err := relaycore.CheckAlarm(context.Background(), r.src, "s", r.now.Now())
	if err != nil {
		t.Fatal(err)
	}
	if chk.DueMS <= r.now.Now().UnixMilli() {
		t.Fatalf("alarm due %d after a failed fire ending at %d; want a back-off", chk.DueMS, r.now.Now().UnixMilli())
	}
	if due := r.next(); due != chk.DueMS {
		t.Fatalf("next wake-up at %d; want the back-off's %d (fire started %d), not lengthened", due, chk.DueMS, start)
	}
	if s := r.clock.Stats(); s.Lingered != 0 {
		t.Fatalf("stats %+v; want nothing lingered", s)
	}
}

// An alarm whose budget ran out before the rows did (a backlog) is
// followed by the next fire at once: a hold would only slow the drain,
// the fires being full already.
func TestLingerLeavesBacklogAlone(t *testing.T) {
	r := newLingerRig(t, 2, time.Second)
	r.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 1, TargetsPerFire: 8, CallsPerTarget: 1, RowsPerFire: 2}
	r.enqueue(6)
	r.fire()
	if due, now := r.next(), r.now.Now().UnixMilli(); due < 0 || due > now {
		t.Fatalf("next wake-up at %d; want one due at once (by %d): 4 rows are left", due, now)
	}
	if st := r.clock.Stats(); st.Lingered != 0 {
		t.Fatalf("stats %+v; want nothing lingered", st)
	}
	for r.clock.RunNext(context.Background()) {
	}
	checkDelivered(t, shared{src: r.src, dst: r.dst.Store}, []relaycore.Partition{"s"}, 6)
}
