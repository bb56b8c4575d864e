package relaycore_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

func (e *env) enqueueKey(key string, ttl time.Duration, rows ...relaycore.Row) (relaycore.CommitResult, error) {
	e.t.Helper()
	return relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, rows,
		relaycore.EnqueueConfig{IdempotencyKey: key, IdempotencyTTL: ttl})
}

// countApplies counts source Apply calls from now on.
func (e *env) countApplies() func() int {
	var mu sync.Mutex
	n := 0
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			mu.Lock()
			n++
			mu.Unlock()
		}
		return nil
	}, nil)
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// A replay (same key, same rows, record live) returns the first call's
// seqs and writes nothing: the store stays byte for byte as it was, and the
// only Apply is the one whose idempotency guard fails (the guard is tried
// before the record is read, so first commits pay no extra read).
func TestIdempotentReplay(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t1", "before", "x")) // seq 1, so the keyed rows start at 2
	rows := []relaycore.Row{put("t1", "a", "1"), put("t2", "b", "2"), put("t1", "c", "3")}
	first, err := e.enqueueKey("order-42", 0, rows...)
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || first.Batches != 1 || !slices.Equal(first.Seqs, []uint64{2, 4, 3}) {
		t.Fatalf("first commit %+v", first)
	}
	dump := e.src.Dump()
	applies := e.countApplies()
	e.clock.Advance(23 * time.Hour)
	again, err := e.enqueueKey("order-42", 0, rows...)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || again.Batches != 0 || !slices.Equal(again.Seqs, first.Seqs) {
		t.Errorf("replay %+v, want Replayed with seqs %v", again, first.Seqs)
	}
	if n := applies(); n != 1 {
		t.Errorf("replay made %d Apply calls, want 1 (failing on its guard)", n)
	}
	if !reflect.DeepEqual(e.src.Dump(), dump) {
		t.Errorf("replay changed the store:\nbefore %v\nafter  %v", dump, e.src.Dump())
	}
	if v := e.inspect(e.source); len(v.Rows()) != 4 || len(v.Other) != 0 || !slices.Equal(v.Idempotency, []string{relaycore.IdemPrefix + "order-42"}) {
		t.Errorf("source holds %d rows, idempotency %v, other %v", len(v.Rows()), v.Idempotency, v.Other)
	}
}

// The same key with other rows (or the same rows in another order) is
// refused while the record lives, and nothing is written.
func TestIdempotencyKeyReused(t *testing.T) {
	e := newEnv(t, "free")
	rows := []relaycore.Row{put("t1", "a", "1"), del("t2", "b")}
	if _, err := e.enqueueKey("k1", 0, rows...); err != nil {
		t.Fatal(err)
	}
	dump := e.src.Dump()
	for name, other := range map[string][]relaycore.Row{
		"other value":  {put("t1", "a", "2"), del("t2", "b")},
		"other order":  {del("t2", "b"), put("t1", "a", "1")},
		"fewer rows":   {put("t1", "a", "1")},
		"other target": {put("t3", "a", "1"), del("t2", "b")},
		"put vs key":   {put("t1", "a1", ""), del("t2", "b")},
	} {
		t.Run(name, func(t *testing.T) {
			res, err := e.enqueueKey("k1", 0, other...)
			if !errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
				t.Fatalf("got %+v, %v; want ErrIdempotencyKeyReused", res, err)
			}
			if slices.ContainsFunc(res.Seqs, func(s uint64) bool { return s != 0 }) || res.Replayed {
				t.Errorf("refused request reports %+v", res)
			}
			if !reflect.DeepEqual(e.src.Dump(), dump) {
				t.Errorf("refused request changed the store")
			}
		})
	}
}

// Once a record expires its key is free: other rows commit under it (the
// expired record is overwritten under a guard on its exact value).
func TestIdempotencyExpiry(t *testing.T) {
	e := newEnv(t, "free")
	if _, err := e.enqueueKey("k", time.Hour, put("t1", "a", "1")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour - time.Millisecond)
	if _, err := e.enqueueKey("k", time.Hour, put("t1", "a", "2")); !errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
		t.Fatalf("1ms before expiry: %v, want ErrIdempotencyKeyReused", err)
	}
	e.clock.Advance(time.Millisecond)
	res, err := e.enqueueKey("k", time.Hour, put("t1", "a", "2"))
	if err != nil || res.Replayed || !slices.Equal(res.Seqs, []uint64{2}) {
		t.Fatalf("after expiry: %+v, %v; want a new commit at seq 2", res, err)
	}
	// The new record answers retries of the new rows.
	res, err = e.enqueueKey("k", time.Hour, put("t1", "a", "2"))
	if err != nil || !res.Replayed || !slices.Equal(res.Seqs, []uint64{2}) {
		t.Fatalf("replay of the new rows: %+v, %v", res, err)
	}
	if got := len(e.inspect(e.source).Rows()); got != 2 {
		t.Errorf("%d rows in the outbox, want 2", got)
	}
}

// The lost-response case the feature exists for: the batch lands, the
// response is lost and nothing can be re-read, so the caller gets
// ErrCommitUnknown; its retry with the same key must not commit the rows a
// second time. Without the key the retry would duplicate them.
func TestIdempotentRetryAfterLostResponse(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			e := newEnv(t, "free")
			key := ""
			if keyed {
				key = "req-7"
			}
			rows := []relaycore.Row{put("t1", "a", "1"), put("t2", "b", "2")}
			landed := false
			var mu sync.Mutex
			e.srcF.set(func(c call) error {
				mu.Lock()
				defer mu.Unlock()
				if landed && c.Op != "apply" {
					return errInjected // the store is unreachable after the commit
				}
				return nil
			}, func(c call) error {
				mu.Lock()
				defer mu.Unlock()
				if c.Op != "apply" {
					return nil
				}
				landed = true
				return maybeApplied()
			})
			_, err := e.enqueueKey(key, 0, rows...)
			if !errors.Is(err, relaycore.ErrCommitUnknown) {
				t.Fatalf("first attempt: %v, want ErrCommitUnknown", err)
			}
			e.srcF.set(nil, nil)
			res, err := e.enqueueKey(key, 0, rows...)
			if err != nil {
				t.Fatal(err)
			}
			got := len(e.inspect(e.source).Rows())
			if keyed {
				if !res.Replayed || !slices.Equal(res.Seqs, []uint64{1, 2}) || got != 2 {
					t.Fatalf("retry %+v; outbox holds %d rows, want the 2 rows once", res, got)
				}
				e.drain(e.source, 10)
				if v, ok := e.target("t2", "b"); !ok || v != "2" {
					t.Errorf("t2/b = %q, %v after drain", v, ok)
				}
			} else if got != 4 {
				t.Fatalf("without a key the retry should duplicate (that is the bug the key prevents): %d rows", got)
			}
		})
	}
}

// An ambiguous commit that can be resolved is resolved by the record: the
// call returns the seqs, and its own retry is a replay.
func TestIdempotentAmbiguousResolved(t *testing.T) {
	e := newEnv(t, "free")
	once := sync.Once{}
	e.srcF.set(nil, func(c call) error {
		var err error
		if c.Op == "apply" {
			once.Do(func() { err = maybeApplied() })
		}
		return err
	})
	res, err := e.enqueueKey("k", 0, put("t1", "a", "1"))
	if err != nil || res.Replayed || !slices.Equal(res.Seqs, []uint64{1}) {
		t.Fatalf("ambiguous commit: %+v, %v", res, err)
	}
	res, err = e.enqueueKey("k", 0, put("t1", "a", "1"))
	if err != nil || !res.Replayed || !slices.Equal(res.Seqs, []uint64{1}) {
		t.Fatalf("retry: %+v, %v", res, err)
	}
}

// Concurrent identical requests commit the rows once; every caller gets
// the same seqs.
func TestIdempotentConcurrent(t *testing.T) {
	e := newEnv(t, "free")
	rows := []relaycore.Row{put("t1", "a", "1"), put("t1", "b", "2")}
	const n = 8
	results := make([]relaycore.CommitResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, rows,
				relaycore.EnqueueConfig{IdempotencyKey: "same"})
		})
	}
	wg.Wait()
	committed := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !slices.Equal(results[i].Seqs, []uint64{1, 2}) {
			t.Errorf("caller %d got seqs %v", i, results[i].Seqs)
		}
		if !results[i].Replayed {
			committed++
		}
	}
	if got := len(e.inspect(e.source).Rows()); got != 2 || committed != 1 {
		t.Errorf("%d rows in the outbox, %d callers committed; want 2 rows, 1 commit", got, committed)
	}
}

// Rows that need more than one batch, or whose one batch has no room for
// the idempotency record, are refused before anything is written; without
// a key the same rows commit in a chain.
func TestIdempotentTooLarge(t *testing.T) {
	caps := relaycore.Capabilities{MaxBatchItems: 5}
	for _, targets := range []int{3, 4} { // 3: fits without the record; 4: needs two batches
		t.Run(fmt.Sprintf("targets=%d", targets), func(t *testing.T) {
			e := newEnv(t, "free")
			e.src = mem.New(caps)
			e.srcF.Store = e.src
			var rows []relaycore.Row
			for i := range targets {
				rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%d", i)), "k", "v"))
			}
			res, err := e.enqueueKey("big", 0, rows...)
			if !errors.Is(err, relaycore.ErrIdempotentRequestTooLarge) || res.Batches != 0 {
				t.Fatalf("got %+v, %v; want ErrIdempotentRequestTooLarge", res, err)
			}
			if d := e.src.Dump(); len(d) != 0 {
				t.Fatalf("refused request wrote %v", d)
			}
			if res := e.enqueue(rows...); len(res.Seqs) != targets || res.Seqs[targets-1] == 0 {
				t.Fatalf("without a key: %+v", res)
			}
		})
	}
}

func TestInvalidIdempotencyKey(t *testing.T) {
	for name, key := range map[string]string{
		"too long":  strings.Repeat("k", relaycore.MaxIdempotencyKeyLen+1),
		"space":     "a b",
		"slash":     "a/b",
		"non-ascii": "clé",
		"nul":       "a\x00",
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, "free")
			_, err := e.enqueueKey(key, 0, put("t1", "a", "1"))
			if !errors.Is(err, relaycore.ErrInvalidIdempotencyKey) {
				t.Fatalf("%v, want ErrInvalidIdempotencyKey", err)
			}
			if d := e.src.Dump(); len(d) != 0 {
				t.Fatalf("refused request wrote %v", d)
			}
		})
	}
	e := newEnv(t, "free")
	for _, key := range []string{"a", strings.Repeat("Z", relaycore.MaxIdempotencyKeyLen), "A-z_0.9:x"} {
		if _, err := e.enqueueKey(key, 0, put("t1", key, "1")); err != nil {
			t.Errorf("key %q: %v", key, err)
		}
	}
}

// Expired records are collected by alarms, at most 16 per alarm, and live
// records never.
func TestIdempotencyGarbageBounded(t *testing.T) {
	e := newEnv(t, "free")
	const expired = 40
	for i := range expired {
		if _, err := e.enqueueKey(fmt.Sprintf("old-%02d", i), time.Hour, put("t1", "k", "v")); err != nil {
			t.Fatal(err)
		}
	}
	e.drain(e.source, 20)
	if got := len(e.inspect(e.source).Idempotency); got != expired {
		t.Fatalf("%d records before expiry, want %d (none may be collected while live)", got, expired)
	}
	e.clock.Advance(2 * time.Hour)
	// Every batch that deletes records deletes at most 16, each guarded on
	// its exact current value.
	var mu sync.Mutex
	var problems []string
	e.srcF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		n := 0
		for _, w := range c.Batch.Writes {
			if !strings.HasPrefix(w.Key, relaycore.IdemPrefix) || !w.Delete {
				continue
			}
			n++
			cur, _, err := e.src.Get(e.ctx, c.P, w.Key)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(c.Batch.Preconditions, func(p relaycore.Precondition) bool {
				return p.Key == w.Key && !p.Absent && string(p.Value) == string(cur)
			}) {
				mu.Lock()
				problems = append(problems, "unguarded delete of "+w.Key)
				mu.Unlock()
			}
		}
		if n > 16 {
			mu.Lock()
			problems = append(problems, fmt.Sprintf("one batch deletes %d records", n))
			mu.Unlock()
		}
		return nil
	}, nil)
	left := expired
	for round := 0; left > 0; round++ {
		if round > expired {
			t.Fatalf("expired records not collected after %d rounds: %d left", round, left)
		}
		live := fmt.Sprintf("new-%02d", round)
		if _, err := e.enqueueKey(live, 24*time.Hour, put("t1", "k", live)); err != nil {
			t.Fatal(err)
		}
		alarms, _ := e.drain(e.source, 20)
		v := e.inspect(e.source)
		old, fresh := 0, 0
		for _, k := range v.Idempotency {
			if strings.HasPrefix(k, relaycore.IdemPrefix+"old-") {
				old++
			} else {
				fresh++
			}
		}
		if removed := left - old; removed < 0 || removed > 16*alarms {
			t.Fatalf("round %d: %d alarms removed %d expired records, bound 16 per alarm", round, alarms, removed)
		}
		if fresh != round+1 {
			t.Fatalf("round %d: %d live records left, want %d", round, fresh, round+1)
		}
		left = old
	}
	if len(problems) > 0 {
		t.Fatalf("garbage collection: %v", problems)
	}
}

// Idempotency records sort after every key the enqueue snapshot, the page
// scan and rs use, so those scans never read them.
func TestIdemPrefixOrder(t *testing.T) {
	lowest := relaycore.IdemPrefix + "-" // '-' is the smallest key byte allowed
	for _, k := range []string{relaycore.KeyAlarm, layout.KeyLease, relaycore.KeyOS, relaycore.KeyRS, layout.PageKey(^uint64(0)), "r0"} {
		if k >= lowest || k >= relaycore.IdemPrefix {
			t.Errorf("key %q does not sort before %q", k, relaycore.IdemPrefix)
		}
	}
}

// The idempotency guarantees on the real stores: bbolt in a temp file and
// DynamoDB through aws-sdk-go-v2 against an in-process minidyn endpoint
// (where the failed precondition is named from CancellationReasons).
func TestIdempotencyOnRealStores(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) relaycore.Store{
		"bolt": func(t *testing.T) relaycore.Store {
			db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return db.Store("source")
		},
		"dynamo": func(t *testing.T) relaycore.Store {
			client := dynamotest.Start(t).Client(nil)
			if err := dynamo.CreateTable(t.Context(), client, "source"); err != nil {
				t.Fatal(err)
			}
			return dynamo.New(client, "source", dynamo.Options{})
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, clock, source := t.Context(), newTestClock(), relaycore.Partition("orders")
			st := &faultStore{Store: open(t)}
			dump := func() []relaycore.Item {
				var out []relaycore.Item
				after := ""
				for {
					pg, err := st.Store.Scan(ctx, source, relaycore.ScanRequest{After: after})
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, pg.Items...)
					if pg.Next == "" {
						return out
					}
					after = pg.Next
				}
			}
			commit := func(key string, rows ...relaycore.Row) (relaycore.CommitResult, error) {
				return relaycore.CommitRelayRows(ctx, st, clock, source, nil, time.Time{}, rows,
					relaycore.EnqueueConfig{IdempotencyKey: key, IdempotencyTTL: time.Hour})
			}
			if _, err := commit("", put("t1", "a", "0")); err != nil {
				t.Fatal(err)
			}
			rows := []relaycore.Row{put("t1", "a", "1"), del("t2", "b")}
			first, err := commit("k", rows...)
			if err != nil || !slices.Equal(first.Seqs, []uint64{2, 3}) {
				t.Fatalf("first: %+v, %v", first, err)
			}
			if _, err := commit("", put("t1", "a", "2")); err != nil { // os moves on
				t.Fatal(err)
			}
			before := dump()
			res, err := commit("k", rows...)
			if err != nil || !res.Replayed || !slices.Equal(res.Seqs, first.Seqs) {
				t.Fatalf("replay: %+v, %v", res, err)
			}
			if _, err := commit("k", rows[0]); !errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
				t.Fatalf("reuse: %v", err)
			}
			if !reflect.DeepEqual(dump(), before) {
				t.Fatalf("replay or refused reuse changed the store")
			}

			// Lost response, store unreachable until the retry.
			var mu sync.Mutex
			landed := false
			st.set(func(c call) error {
				mu.Lock()
				defer mu.Unlock()
				if landed && c.Op != "apply" {
					return errInjected
				}
				return nil
			}, func(c call) error {
				mu.Lock()
				defer mu.Unlock()
				if c.Op == "apply" {
					landed = true
					return maybeApplied()
				}
				return nil
			})
			if _, err := commit("lost", put("t3", "c", "1")); !errors.Is(err, relaycore.ErrCommitUnknown) {
				t.Fatalf("lost response: %v, want ErrCommitUnknown", err)
			}
			st.set(nil, nil)
			res, err = commit("lost", put("t3", "c", "1"))
			if err != nil || !res.Replayed || !slices.Equal(res.Seqs, []uint64{5}) {
				t.Fatalf("retry after a lost response: %+v, %v", res, err)
			}

			// After expiry an alarm drains the outbox and collects both records.
			clock.Advance(2 * time.Hour)
			h := &relaycore.RelayHandler{Source: st, Target: mem.New(relaycore.Capabilities{}), Clock: clock}
			for i := 0; ; i++ {
				v, err := relaycore.InspectSource(ctx, st, source)
				if err != nil {
					t.Fatal(err)
				}
				if v.Alarm == nil {
					if len(v.Rows()) != 0 || len(v.Idempotency) != 0 || len(v.Other) != 0 {
						t.Fatalf("after drain: %d rows, records %v, other %v", len(v.Rows()), v.Idempotency, v.Other)
					}
					break
				}
				if i > 10 {
					t.Fatalf("not drained after %d alarms", i)
				}
				clock.Set(time.UnixMilli(v.Alarm.DueMS))
				if _, err := h.Alarm(ctx, source); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// idemScans counts the scans of the idempotency records' range the store
// sees (the alarm's clean-up is their only reader besides the enqueue's
// Get of its own key).
func idemScans(e *env) *atomic.Int64 {
	var n atomic.Int64
	e.srcF.set(func(c call) error {
		if c.Op == "scan" && strings.HasPrefix(c.Key, relaycore.IdemPrefix) {
			n.Add(1)
		}
		return nil
	}, nil)
	return &n
}

// An alarm's clean-up reads a source's idempotency records in one scan
// when there are fewer than it looks at (none, or a few): one Query per
// alarm on DynamoDB, where a scan from a moving point to the end and a
// second from the start to it took two.
func TestIdempotencyCleanupOneScan(t *testing.T) {
	for _, records := range []int{0, 10} {
		t.Run(fmt.Sprintf("records=%d", records), func(t *testing.T) {
			e := newEnv(t, "free")
			for i := range records {
				if _, err := e.enqueueKey(fmt.Sprintf("k-%02d", i), time.Hour, put("t1", "k", "v")); err != nil {
					t.Fatal(err)
				}
			}
			e.drain(e.source, 20)
			scans := idemScans(e)
			for round := range 5 {
				e.clock.Advance(time.Millisecond) // another start point
				if _, err := e.enqueueKey("", 0, put("t1", fmt.Sprintf("r%d", round), "v")); err != nil {
					t.Fatal(err)
				}
				before := scans.Load()
				if alarms, _ := e.drain(e.source, 20); alarms != 1 {
					t.Fatalf("round %d: %d alarms, want 1", round, alarms)
				}
				if got := scans.Load() - before; got != 1 {
					t.Fatalf("round %d: the alarm scanned the idempotency records %d times, want once", round, got)
				}
			}
			if got := len(e.inspect(e.source).Idempotency); got != records {
				t.Fatalf("%d records left, want the %d live ones", got, records)
			}
		})
	}
}

// With more records than one clean-up looks at, live records early in key
// order cannot hide expired ones behind them: the clean-up starts at a
// point that moves with the clock, so the expired records at the end of
// the range are collected within one turn of it, and no live one ever.
func TestIdempotencyGarbageBehindLiveRecords(t *testing.T) {
	e := newEnv(t, "free")
	const live, expired = 100, 20
	for i := range live {
		if _, err := e.enqueueKey(fmt.Sprintf("a-%03d", i), 1000*time.Hour, put("t1", "k", "v")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range expired {
		if _, err := e.enqueueKey(fmt.Sprintf("z-%02d", i), time.Hour, put("t1", "k", "v")); err != nil {
			t.Fatal(err)
		}
	}
	e.drain(e.source, 50)
	e.clock.Advance(2 * time.Hour)
	count := func() (a, z int) {
		for _, k := range e.inspect(e.source).Idempotency {
			switch {
			case strings.HasPrefix(k, relaycore.IdemPrefix+"a-"):
				a++
			case strings.HasPrefix(k, relaycore.IdemPrefix+"z-"):
				z++
			}
		}
		return a, z
	}
	// The start point takes each of 66 key characters in turn, one per
	// millisecond: two turns at most.
	for round := 0; ; round++ {
		a, z := count()
		if a != live {
			t.Fatalf("round %d: %d live records left, want %d", round, a, live)
		}
		if z == 0 {
			break
		}
		if round > 2*66 {
			t.Fatalf("%d expired records behind %d live ones still there after %d alarms", z, live, round)
		}
		e.clock.Advance(time.Millisecond)
		if _, err := e.enqueueKey("", 0, put("t1", fmt.Sprintf("r%d", round), "v")); err != nil {
			t.Fatal(err)
		}
		e.drain(e.source, 20)
	}
}
