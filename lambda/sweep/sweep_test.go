package sweep_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/lambda/sweep"
	"github.com/relay-dev/relay/relaycore"
)

type kicks struct {
	mu  sync.Mutex
	got []relaycore.Partition
}

func (k *kicks) Kick(_ context.Context, src relaycore.Partition, _ int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.got = append(k.got, src)
	return nil
}

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type env struct {
	src, tgt *mem.Store
	clock    *clock
	kicks    *kicks
	h        *sweep.Handler
}

func newEnv(t *testing.T) *env {
	e := &env{src: mem.New(relaycore.Capabilities{}), tgt: mem.New(relaycore.Capabilities{}), clock: &clock{now: time.UnixMilli(1_800_000_000_000)}, kicks: &kicks{}}
	relay := &relaycore.RelayHandler{Source: e.src, Target: e.tgt, Clock: e.clock, Kicker: e.kicks}
	e.h = &sweep.Handler{Relay: relay, Index: e.src, Source: e.src, Kicker: e.kicks, Clock: e.clock}
	return e
}

// enqueue commits one row for target "t" in each source, one millisecond
// apart, so the index orders them by name.
func (e *env) enqueue(t *testing.T, sources ...string) {
	t.Helper()
	for _, s := range sources {
		row := relaycore.Row{Target: "t", Puts: []relaycore.KV{{Key: "from/" + s, Value: []byte(s)}}}
		if _, err := (&relaycore.RelayHandler{Source: e.src, Clock: e.clock}).Enqueue(t.Context(), relaycore.Partition(s), []relaycore.Row{row}, relaycore.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Millisecond)
	}
}

func (e *env) sweep(t *testing.T, ctx context.Context) sweep.Result {
	t.Helper()
	res, err := e.h.Handle(ctx, []byte(`{"scheduled_time":"2026-11-29T12:00:00Z","execution_id":"x"}`))
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return res
}

func (e *env) delivered(t *testing.T, s string) bool {
	t.Helper()
	v, ok, err := e.tgt.Get(t.Context(), "t", "from/"+s)
	if err != nil {
		t.Fatal(err)
	}
	return ok && string(v) == s
}

func TestSweepFiresOverdueAlarms(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, "a", "b")
	res := e.sweep(t, t.Context())
	if res.Listed != 2 || res.Fired != 2 || res.Kicked != 0 || res.RowsDelivered != 2 || res.More {
		t.Fatalf("result %+v, want both alarms fired in-process", res)
	}
	if !e.delivered(t, "a") || !e.delivered(t, "b") {
		t.Error("rows not delivered")
	}
	// The alarms were cleared: the next sweep finds nothing.
	if again := e.sweep(t, t.Context()); again.Listed != 0 {
		t.Errorf("second sweep %+v, want nothing listed", again)
	}
}

// TestSweepIsBounded: the oldest FireLimit alarms are fired, the next
// KickLimit re-kicked, and the rest left for the next sweep.
func TestSweepIsBounded(t *testing.T) {
	e := newEnv(t)
	e.h.FireLimit, e.h.KickLimit, e.h.Parallel = 2, 2, 1
	e.enqueue(t, "a", "b", "c", "d", "e")
	res := e.sweep(t, t.Context())
	if res.Listed != 4 || res.Fired != 2 || res.Kicked != 2 || !res.More {
		t.Fatalf("result %+v, want 2 fired, 2 kicked, more", res)
	}
	if !slices.Equal(e.kicks.got, []relaycore.Partition{"c", "d"}) {
		t.Errorf("kicked %v, want the next oldest [c d]", e.kicks.got)
	}
	for s, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false, "e": false} {
		if got := e.delivered(t, s); got != want {
			t.Errorf("source %s delivered = %v, want %v", s, got, want)
		}
	}
}

// TestSweepSkipsStaleEntries: an alarm re-armed into the future (back-off)
// is not overdue, whatever the index said.
func TestSweepSkipsStaleEntries(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, "a")
	stale := staleIndex{e.src, relaycore.DueEntry{Partition: "gone", Key: relaycore.KeyAlarm, Due: 1}}
	e.h.Index = stale
	res := e.sweep(t, t.Context())
	if res.Listed != 2 || res.Stale != 1 || res.Fired != 1 {
		t.Fatalf("result %+v, want the vanished alarm counted stale and a fired", res)
	}
}

// staleIndex lists an extra entry whose record no longer exists.
type staleIndex struct {
	*mem.Store
	extra relaycore.DueEntry
}

func (s staleIndex) Due(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	out, err := s.Store.Due(ctx, before, limit)
	return append([]relaycore.DueEntry{s.extra}, out...), err
}

// TestSweepKicksWhenOutOfTime: with less time left than Reserve, nothing
// is started in-process; every overdue alarm is re-kicked instead.
func TestSweepKicksWhenOutOfTime(t *testing.T) {
	e := newEnv(t)
	e.h.Reserve = time.Hour
	e.enqueue(t, "a", "b")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res := e.sweep(t, ctx)
	if res.Fired != 0 || res.Kicked != 2 {
		t.Fatalf("result %+v, want both re-kicked", res)
	}
	if e.delivered(t, "a") {
		t.Error("a was fired despite the deadline")
	}
}

func TestSweepFutureAlarmsWait(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, "a")
	e.clock.Advance(-time.Hour) // the alarm is due an hour from "now"
	if res := e.sweep(t, t.Context()); res.Listed != 0 || res.Fired != 0 {
		t.Fatalf("result %+v, want nothing before the due time", res)
	}
}

func TestSweepRefusesInvalidEvents(t *testing.T) {
	for name, payload := range map[string]string{
		"malformed.json shape": `{"sourc":"orders","note":"x"}`,
		"bad time":             `{"scheduled_time":"yesterday"}`,
		"not an object":        `[]`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.enqueue(t, "a")
			_, err := e.h.Handle(t.Context(), []byte(payload))
			if !errors.Is(err, event.ErrInvalidEvent) {
				t.Fatalf("err = %v, want an invalid event error", err)
			}
			if e.delivered(t, "a") || len(e.kicks.got) != 0 {
				t.Error("a refused sweep event fired or kicked")
			}
		})
	}
}

func TestSweepEventFieldsAreOptional(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{`{}`, `{"execution_id":"e"}`} {
		if _, err := e.h.Handle(t.Context(), []byte(p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
