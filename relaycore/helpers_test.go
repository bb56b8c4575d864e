package relaycore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// testClock is a manual clock: time moves only when a test says so.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.UnixMilli(1_800_000_000_000)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// call describes one store call to a faultStore's interceptor.
type call struct {
	Op    string // "get", "getmany", "scan", "apply"
	P     relaycore.Partition
	Key   string   // get key; first key for getmany; first write key for apply
	Keys  []string // getmany keys
	Batch relaycore.Batch
	N     int // 1-based index of this call among all calls to the store
}

// faultStore wraps a real store (infra/mem) and lets a test fail or "crash"
// chosen calls. before may return an error to fail the call without running
// it; after (apply only) runs once the real call committed and may replace
// its result (e.g. with ErrMaybeApplied to simulate a lost response).
type faultStore struct {
	relaycore.Store
	mu        sync.Mutex
	n         int
	before    func(c call) error
	after     func(c call) error
	scanLimit int // > 0 caps every Scan's Limit
}

func (f *faultStore) next(c call) (call, func(call) error, func(call) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	c.N = f.n
	return c, f.before, f.after
}

func (f *faultStore) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	c, before, _ := f.next(call{Op: "get", P: p, Key: key})
	if before != nil {
		if err := before(c); err != nil {
			return nil, false, err
		}
	}
	return f.Store.Get(ctx, p, key)
}

// GetMany is one call however many keys it reads, so a test can fail a
// batch read as a whole. Without it relaycore.GetMany would fall back to
// Get per key on this wrapper.
func (f *faultStore) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	c := call{Op: "getmany", P: p, Keys: slices.Clone(keys)}
	if len(keys) > 0 {
		c.Key = keys[0]
	}
	c, before, after := f.next(c)
	if before != nil {
		if err := before(c); err != nil {
			return nil, err
		}
	}
	m, err := relaycore.GetMany(ctx, f.Store, p, keys)
	if after != nil && err == nil {
		if aerr := after(c); aerr != nil {
			return nil, aerr
		}
	}
	return m, err
}

func (f *faultStore) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	c, before, after := f.next(call{Op: "scan", P: p, Key: req.Start})
	if before != nil {
		if err := before(c); err != nil {
			return relaycore.ScanPage{}, err
		}
	}
	if f.scanLimit > 0 && (req.Limit <= 0 || req.Limit > f.scanLimit) {
		req.Limit = f.scanLimit
	}
	pg, err := f.Store.Scan(ctx, p, req)
	if after != nil && err == nil {
		if aerr := after(c); aerr != nil {
			return relaycore.ScanPage{}, aerr
		}
	}
	return pg, err
}

func (f *faultStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	key := ""
	if len(b.Writes) > 0 {
		key = b.Writes[0].Key
	}
	c, before, after := f.next(call{Op: "apply", P: p, Key: key, Batch: b})
	if before != nil {
		if err := before(c); err != nil {
			return err
		}
	}
	err := f.Store.Apply(ctx, p, b)
	if err == nil && after != nil {
		return after(c)
	}
	return err
}

func (f *faultStore) set(before, after func(call) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before, f.after = before, after
}

var errInjected = fmt.Errorf("injected failure")

// maybeApplied is the store error for "the response was lost".
func maybeApplied() error { return fmt.Errorf("injected timeout: %w", relaycore.ErrMaybeApplied) }

type env struct {
	t      *testing.T
	ctx    context.Context
	clock  *testClock
	src    *mem.Store
	tgt    *mem.Store
	srcF   *faultStore
	tgtF   *faultStore
	h      *relaycore.RelayHandler
	source relaycore.Partition
}

func newEnv(t *testing.T, plan string) *env {
	t.Helper()
	b, err := relaycore.PlanBudget(plan)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: context.Background(), clock: newTestClock(), src: mem.New(relaycore.Capabilities{}), tgt: mem.New(relaycore.Capabilities{}), source: "src-a"}
	e.srcF = &faultStore{Store: e.src}
	e.tgtF = &faultStore{Store: e.tgt}
	e.h = &relaycore.RelayHandler{Source: e.srcF, Target: e.tgtF, Budget: b, Clock: e.clock}
	return e
}

func put(target relaycore.Partition, kv ...string) relaycore.Row {
	r := relaycore.Row{Target: target}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Puts = append(r.Puts, relaycore.KV{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return r
}

func del(target relaycore.Partition, keys ...string) relaycore.Row {
	return relaycore.Row{Target: target, Deletes: keys}
}

func (e *env) enqueue(rows ...relaycore.Row) relaycore.CommitResult {
	e.t.Helper()
	return e.enqueueFrom(e.source, rows...)
}

func (e *env) enqueueFrom(source relaycore.Partition, rows ...relaycore.Row) relaycore.CommitResult {
	e.t.Helper()
	res, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, source, nil, time.Time{}, rows, relaycore.EnqueueConfig{})
	if err != nil {
		e.t.Fatalf("enqueue: %v", err)
	}
	return res
}

// drain runs alarms for source until its alarm record is gone, advancing
// the clock to each due time. It fails the test after limit alarms.
func (e *env) drain(source relaycore.Partition, limit int) (alarms int, total relaycore.AlarmResult) {
	e.t.Helper()
	for {
		v := e.inspect(source)
		if v.Alarm == nil {
			return alarms, total
		}
		if alarms >= limit {
			e.t.Fatalf("source %s not drained after %d alarms: %d rows left, rs %+v", source, alarms, len(v.Rows()), v.RS)
		}
		e.clock.Set(time.UnixMilli(v.Alarm.DueMS))
		ar, err := e.h.Alarm(e.ctx, source)
		if err != nil {
			e.t.Fatalf("alarm %d: %v", alarms, err)
		}
		alarms++
		total.Fires += ar.Fires
		total.RowsDelivered += ar.RowsDelivered
		total.RowsCleaned += ar.RowsCleaned
		total.TargetCalls += ar.TargetCalls
		total.TargetsBlock += ar.TargetsBlock
	}
}

func (e *env) inspect(source relaycore.Partition) relaycore.SourceView {
	e.t.Helper()
	v, err := relaycore.InspectSource(e.ctx, e.src, source)
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

func (e *env) target(p relaycore.Partition, key string) (string, bool) {
	e.t.Helper()
	v, ok, err := e.tgt.Get(e.ctx, p, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(v), ok
}

// countTargetApplies counts target batches that commit from now on (a
// batch its rh guard refuses is no delivery: it is not counted).
func (e *env) countTargetApplies() *int {
	var n int
	var mu sync.Mutex
	e.tgtF.set(nil, func(c call) error {
		if c.Op == "apply" {
			mu.Lock()
			n++
			mu.Unlock()
		}
		return nil
	})
	return &n
}

func timeMS(ms int64) time.Time { return time.UnixMilli(ms) }
