package fire_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// kicks records relaycore.Kicker calls.
type kicks struct {
	mu  sync.Mutex
	got []string
}

func (k *kicks) Kick(_ context.Context, src relaycore.Partition, dueMS int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.got = append(k.got, fmt.Sprintf("%s@%d", src, dueMS))
	return nil
}

func (k *kicks) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.got...)
}

// gatedTarget wraps the target store: it counts committed applies per
// target and, when gate is set, holds the first apply until gate closes.
type gatedTarget struct {
	relaycore.Store
	applies  sync.Map // relaycore.Partition -> *atomic.Int64
	gate     chan struct{}
	entered  chan struct{}
	once     sync.Once
	failures atomic.Int64
}

func (g *gatedTarget) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if g.gate != nil {
		g.once.Do(func() {
			close(g.entered)
			<-g.gate
		})
	}
	err := g.Store.Apply(ctx, p, b)
	if err != nil {
		g.failures.Add(1)
		return err
	}
	n, _ := g.applies.LoadOrStore(p, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	return nil
}

func (g *gatedTarget) count(p relaycore.Partition) int64 {
	n, ok := g.applies.Load(p)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

type env struct {
	src    *mem.Store
	tgt    *gatedTarget
	kicks  *kicks
	relay  *relaycore.RelayHandler
	h      *fire.Handler
	clock  relaycore.Clock
	source relaycore.Partition
}

func newEnv(t *testing.T, plan string) *env {
	t.Helper()
	b, err := relaycore.PlanBudget(plan)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{src: mem.New(relaycore.Capabilities{}), tgt: &gatedTarget{Store: mem.New(relaycore.Capabilities{})}, kicks: &kicks{}, clock: relaycore.SystemClock{}, source: "orders"}
	e.relay = &relaycore.RelayHandler{Source: e.src, Target: e.tgt, Budget: b, Clock: e.clock, Kicker: e.kicks}
	e.h = &fire.Handler{Relay: e.relay}
	return e
}

// enqueue commits one row to each of n targets t000, t001, ...
func (e *env) enqueue(t *testing.T, n int) {
	t.Helper()
	rows := make([]relaycore.Row, n)
	for i := range rows {
		rows[i] = relaycore.Row{Target: relaycore.Partition(fmt.Sprintf("t%03d", i)), Puts: []relaycore.KV{{Key: "k", Value: []byte(fmt.Sprint(i))}}}
	}
	if _, err := (&relaycore.RelayHandler{Source: e.src, Clock: e.clock}).Enqueue(t.Context(), e.source, rows, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) fire(t *testing.T) fire.Result {
	t.Helper()
	res, err := e.h.Handle(t.Context(), []byte(`{"source":"`+string(e.source)+`"}`))
	if err != nil {
		t.Fatalf("fire: %v", err)
	}
	return res
}

func TestFireRefusesInvalidEvents(t *testing.T) {
	for name, payload := range map[string]string{
		"malformed.json shape": `{"sourc":"orders","note":"x"}`,
		"no source":            `{}`,
		"empty source":         `{"source":""}`,
		"reserved source":      `{"source":"_relay/x"}`,
		"number":               `{"source":7}`,
		"not an object":        `"orders"`,
		"two objects":          `{"source":"a"}{"source":"b"}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(t, 2)
			before := e.src.Dump()
			_, err := e.h.Handle(t.Context(), []byte(payload))
			var ie *event.InvalidEventError
			if !errors.As(err, &ie) || ie.Function != "fire" {
				t.Fatalf("err = %v, want *event.InvalidEventError", err)
			}
			if fmt.Sprint(e.src.Dump()) != fmt.Sprint(before) || len(e.tgt.Store.(*mem.Store).Dump()) != 0 {
				t.Error("a refused event changed the stores")
			}
		})
	}
}

func TestFireDeliversAndClears(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(t, 3)
	res := e.fire(t)
	if res.RowsDelivered != 3 || !res.Cleared || res.Busy || res.NextDueMS != 0 {
		t.Fatalf("result %+v, want 3 rows delivered and the alarm cleared", res)
	}
	for i := range 3 {
		tgt := relaycore.Partition(fmt.Sprintf("t%03d", i))
		rh, err := relaycore.TargetWatermark(t.Context(), e.tgt, tgt, e.source)
		if err != nil || rh == 0 {
			t.Errorf("%s rh = %d, %v", tgt, rh, err)
		}
		v, ok, _ := e.tgt.Get(t.Context(), tgt, "k")
		if !ok || string(v) != fmt.Sprint(i) {
			t.Errorf("%s k = %q, %v", tgt, v, ok)
		}
	}
	if v, _ := relaycore.InspectSource(t.Context(), e.src, e.source); v.Alarm != nil || len(v.Pages) != 0 {
		t.Errorf("source after drain: alarm %v, %d pages", v.Alarm, len(v.Pages))
	}
	// A duplicate event (at-least-once delivery) finds nothing to do.
	if again := e.fire(t); again.RowsDelivered != 0 || again.TargetCalls != 0 || !again.Cleared {
		t.Errorf("duplicate fire %+v, want nothing delivered and no target calls", again)
	}
}

// TestFireRearmsWhileWorkRemains: a backlog larger than one alarm's budget
// (free: 2 fires × 8 targets) re-arms the alarm due now and kicks once per
// alarm, until the outbox is empty.
func TestFireRearmsWhileWorkRemains(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(t, 40) // ceil(40/16) = 3 alarms
	var alarms int
	for alarms = 1; alarms <= 10; alarms++ {
		res := e.fire(t)
		if res.Cleared {
			break
		}
		if res.NextDueMS == 0 || res.Fires != 2 || res.TargetCalls != 16 {
			t.Fatalf("alarm %d: %+v, want 2 fires, 16 target calls and a re-arm", alarms, res)
		}
		k := e.kicks.list()
		if len(k) != alarms || k[alarms-1] != fmt.Sprintf("orders@%d", res.NextDueMS) {
			t.Fatalf("alarm %d: kicks %v, want one per re-arm at next_due_ms %d", alarms, k, res.NextDueMS)
		}
	}
	if alarms != 3 {
		t.Errorf("drained in %d alarms, want 3", alarms)
	}
}

// TestOverlappingFiresDoNotBothSpendBudget holds the first invocation
// inside its first target apply and runs a duplicate event meanwhile: the
// duplicate must find the claim, step aside as Busy and call no target.
func TestOverlappingFiresDoNotBothSpendBudget(t *testing.T) {
	e := newEnv(t, "free")
	e.tgt.gate, e.tgt.entered = make(chan struct{}), make(chan struct{})
	e.enqueue(t, 5)
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
	if !dup.Busy || dup.TargetCalls != 0 || dup.RowsDelivered != 0 {
		t.Errorf("overlapping duplicate %+v, want busy with no target calls", dup)
	}
	close(e.tgt.gate)
	res := <-first
	if res.RowsDelivered != 5 || res.TargetCalls != 5 || !res.Cleared {
		t.Errorf("first fire %+v, want all 5 rows in 5 target calls", res)
	}
	for i := range 5 {
		if n := e.tgt.count(relaycore.Partition(fmt.Sprintf("t%03d", i))); n != 1 {
			t.Errorf("target t%03d applied %d times, want once", i, n)
		}
	}
	if f := e.tgt.failures.Load(); f != 0 {
		t.Errorf("%d target applies failed: a duplicate spent budget on guarded conflicts", f)
	}
}

// brokenSource fails every read, like an unreachable table.
type brokenSource struct{ relaycore.Store }

func (brokenSource) Get(context.Context, relaycore.Partition, string) ([]byte, bool, error) {
	return nil, false, errors.New("table unreachable")
}

func TestFireReturnsStorageErrors(t *testing.T) {
	e := newEnv(t, "free")
	e.relay.Source = brokenSource{e.src}
	_, err := e.h.Handle(t.Context(), []byte(`{"source":"orders"}`))
	if err == nil || !strings.Contains(err.Error(), "table unreachable") || errors.Is(err, event.ErrInvalidEvent) {
		t.Fatalf("err = %v, want the storage error (Lambda retries, then the DLQ)", err)
	}
}

// FuzzParseEvent: whatever arrives, the parser either refuses it with an
// *event.InvalidEventError or yields a source the engine accepts.
func FuzzParseEvent(f *testing.F) {
	for _, name := range []string{"fire.json", "fire-continuation.json", "malformed.json", "sweep.json"} {
		if data, err := os.ReadFile(filepath.Join("..", "..", "events", name)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"source":"_relay/x"}`))
	f.Add([]byte(`{"source":"orders","hop":3}`))
	f.Add([]byte(`{"source":"orders","hop":-1}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, src, err := fire.ParseEvent(payload)
		if err != nil {
			if !errors.Is(err, event.ErrInvalidEvent) {
				t.Fatalf("error %v is not an invalid event error", err)
			}
			return
		}
		if src == "" || len(src) > relaycore.MaxPartitionLen || strings.HasPrefix(string(src), relaycore.ReservedPrefix) {
			t.Fatalf("accepted source %q", src)
		}
		if ev.Hop < 0 || ev.Hop > fire.MaxContinuationHops {
			t.Fatalf("accepted hop %d", ev.Hop)
		}
	})
}
