package relaycore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// looseStore is the test env's source store as a relaycore.LooseDeleter:
// the fault store's calls, plus DeleteLoose, which records what it was
// asked and deletes each key in a batch of its own (or fails, when fail is
// set, deleting nothing).
type looseStore struct {
	*faultStore
	mu      sync.Mutex
	deleted []string
	calls   int
	fail    bool
}

func (l *looseStore) DeleteLoose(ctx context.Context, p relaycore.Partition, keys []string) error {
	l.mu.Lock()
	l.calls++
	fail := l.fail
	if !fail {
		l.deleted = append(l.deleted, keys...)
	}
	l.mu.Unlock()
	if fail {
		return fmt.Errorf("injected: %w", relaycore.ErrUnavailable)
	}
	for _, k := range keys {
		if err := l.faultStore.Apply(ctx, p, relaycore.Batch{Writes: []relaycore.Write{{Key: k, Delete: true}}}); err != nil {
			return err
		}
	}
	return nil
}

func newLooseEnv(t *testing.T, plan string, caps relaycore.Capabilities) (*env, *looseStore) {
	t.Helper()
	e := newEnv(t, plan)
	e.src = mem.New(caps)
	e.srcF = &faultStore{Store: e.src}
	ls := &looseStore{faultStore: e.srcF}
	e.h.Source = ls
	return e, ls
}

// pageKeys lists the row pages stored in source, ghosts included.
func (e *env) pageKeys(source relaycore.Partition) []string {
	e.t.Helper()
	pg, err := e.src.Scan(e.ctx, source, relaycore.ScanRequest{Start: "r/", End: "r0"})
	if err != nil {
		e.t.Fatal(err)
	}
	var keys []string
	for _, it := range pg.Items {
		keys = append(keys, it.Key)
	}
	return keys
}

// pageApplies records the page keys (outbox and held) that source batches
// of more than one write delete.
func (e *env) pageApplies() *[]string {
	var mu sync.Mutex
	var keys []string
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && len(c.Batch.Writes) > 1 {
			mu.Lock()
			for _, w := range c.Batch.Writes {
				if (strings.HasPrefix(w.Key, "r/") || strings.HasPrefix(w.Key, "u/")) && w.Delete {
					keys = append(keys, w.Key)
				}
			}
			mu.Unlock()
		}
		return nil
	}, nil)
	return &keys
}

func (e *env) targetCounts(target relaycore.Partition) relaycore.TargetStatus {
	e.t.Helper()
	ts, err := relaycore.GetTarget(e.ctx, e.src, e.source, target)
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// The invariant: on a loose store a finished page leaves the outbox in the
// checkpoint that records its rows delivered (listed in rs.gone, never
// deleted in that batch) and is deleted loosely right after; nothing is
// delivered twice or counted twice, and the alarm that clears the source
// leaves rs without a list.
func TestLooseCheckpointListsFinishedPages(t *testing.T) {
	e, ls := newLooseEnv(t, "paid", relaycore.Capabilities{})
	inBatch := e.pageApplies()
	for b := range 3 {
		var rows []relaycore.Row
		for i := range 10 {
			rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%d", i%2)), fmt.Sprintf("k%d-%d", b, i), "v"))
		}
		e.enqueue(rows...)
	}
	pages := e.pageKeys(e.source)
	if len(pages) != 6 {
		t.Fatalf("%d pages enqueued, want 6 (3 batches x 2 targets)", len(pages))
	}
	_, total := e.drain(e.source, 5)
	if total.RowsDelivered != 30 {
		t.Fatalf("delivered %d rows, want 30", total.RowsDelivered)
	}
	if len(*inBatch) != 0 {
		t.Errorf("checkpoint batches deleted pages %v; on a loose store they leave through rs.gone", *inBatch)
	}
	if slices.Sort(ls.deleted); !slices.Equal(ls.deleted, pages) {
		t.Errorf("deleted loosely %v, want the enqueued pages %v", ls.deleted, pages)
	}
	if left := e.pageKeys(e.source); len(left) != 0 {
		t.Errorf("pages left after the drain: %v", left)
	}
	v := e.inspect(e.source)
	if v.RS == nil || len(v.RS.Gone) != 0 {
		t.Errorf("rs after the alarm cleared the source: %+v, want no gone list", v.RS)
	}
	for _, tg := range []relaycore.Partition{"t0", "t1"} {
		if ts := e.targetCounts(tg); ts.Pending != 0 || ts.Enqueued != 15 || ts.Done != 15 {
			t.Errorf("%s: pending %d, enqueued %d, done %d; want 0, 15, 15", tg, ts.Pending, ts.Enqueued, ts.Done)
		}
	}
}

// The invariant: ghosts (pages listed in rs.gone, not yet deleted because
// the delete failed or the process died) are never taken for live pages:
// InspectSource leaves them out (SourceRelayState may answer early), an operator action
// does not move them aside, and the next claim deletes them before it
// reads a page, so their rows are neither applied nor counted again.
func TestLooseGhostsAfterAFailedDelete(t *testing.T) {
	e, ls := newLooseEnv(t, "paid", relaycore.Capabilities{})
	for i := range 8 {
		e.enqueue(put(relaycore.Partition(fmt.Sprintf("t%d", i%2)), fmt.Sprintf("k%d", i), "v"))
	}
	ls.fail = true
	v := e.inspect(e.source)
	e.clock.Set(timeMS(v.Alarm.DueMS))
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err == nil || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Fatalf("alarm with failing loose deletes: %+v, %v; want an unavailable error", ar, err)
	}
	if ar.RowsDelivered != 8 {
		t.Fatalf("the checkpoint recorded %d rows, want 8", ar.RowsDelivered)
	}
	ghosts := e.pageKeys(e.source)
	if len(ghosts) != 8 {
		t.Fatalf("%d pages stored after the failed deletes, want the 8 ghosts", len(ghosts))
	}
	if v := e.inspect(e.source); len(v.Pages) != 0 || len(v.RS.Gone) != 8 {
		t.Errorf("InspectSource shows %d pages (rs.gone %v); want none, 8 listed", len(v.Pages), v.RS.Gone)
	}
	// SourceRelayState does not read rs: a ghost makes it early (the
	// first ghost's row), never late.
	st, err := relaycore.SourceRelayState(e.ctx, e.src, e.source, e.clock.Now())
	if err != nil || st.Empty || st.FirstUndelivered != 1 {
		t.Errorf("SourceRelayState with only ghosts: %+v, %v; want the first ghost's seq 1", st, err)
	}
	// An operator action claims the source: the ghosts go first, and
	// none of their rows is held.
	ls.fail = false
	applies := e.countTargetApplies()
	ts, err := e.h.Quarantine(e.ctx, e.source, "t0", relaycore.Actor{By: "op", Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if ts.Held != 0 || ts.Pending != 0 {
		t.Errorf("quarantine after ghosts: held %d, pending %d; want 0, 0", ts.Held, ts.Pending)
	}
	if left := e.pageKeys(e.source); len(left) != 0 {
		t.Errorf("ghosts left after the operator's claim: %v", left)
	}
	if _, err := e.h.Release(e.ctx, e.source, "t0", relaycore.Actor{By: "op", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 5)
	if *applies != 0 {
		t.Errorf("%d target applies after the rows were delivered; want 0", *applies)
	}
	for _, tg := range []relaycore.Partition{"t0", "t1"} {
		if ts := e.targetCounts(tg); ts.Pending != 0 || ts.Done != 4 {
			t.Errorf("%s: pending %d, done %d; want 0, 4 (ghosts counted once)", tg, ts.Pending, ts.Done)
		}
	}
}

// The invariant: a fire's claim deletes the ghosts a crashed fire left
// before it scans, with one read of them all and a loose delete of those
// still there, and later rows are delivered as usual.
func TestLooseClaimDeletesGhosts(t *testing.T) {
	e, ls := newLooseEnv(t, "paid", relaycore.Capabilities{})
	for i := range 4 {
		e.enqueue(put("t", fmt.Sprintf("k%d", i), "v"))
	}
	ls.fail = true
	e.clock.Set(timeMS(e.inspect(e.source).Alarm.DueMS))
	if _, err := e.h.Alarm(e.ctx, e.source); err == nil {
		t.Fatal("alarm with failing loose deletes succeeded")
	}
	ls.fail = false
	e.enqueue(put("t", "k4", "v"))
	calls := ls.calls
	_, total := e.drain(e.source, 5)
	if total.RowsDelivered != 1 {
		t.Errorf("delivered %d rows after the ghosts, want the 1 new one", total.RowsDelivered)
	}
	if ls.calls < calls+2 {
		t.Errorf("%d loose deletes after the failure, want at least 2 (the ghosts, the new page)", ls.calls-calls)
	}
	if left := e.pageKeys(e.source); len(left) != 0 {
		t.Errorf("pages left: %v", left)
	}
	if ts := e.targetCounts("t"); ts.Pending != 0 || ts.Done != 5 {
		t.Errorf("pending %d, done %d; want 0, 5", ts.Pending, ts.Done)
	}
}

// The invariant: a loose target that fails and is moved aside in the same
// fire (quarantined at its first failure here) gets room for every move in
// its checkpoint, although its pages after the first reserved no item: the
// store's item limit (10) is never exceeded. Each move is one put under the
// held key (the outbox page leaves through rs.gone): 5 pages fit (rs, q,
// the record, the marker and 5 puts: 9 items), 7 do not (11), and the fire
// leaves those in the outbox instead of failing its checkpoint.
func TestLooseMoveAsideFitsTheBatch(t *testing.T) {
	for _, c := range []struct {
		pages int
		moved bool
	}{{5, true}, {7, false}} {
		t.Run(fmt.Sprintf("pages=%d", c.pages), func(t *testing.T) {
			e, _ := newLooseEnv(t, "paid", relaycore.Capabilities{MaxBatchItems: 10})
			e.h.QuarantineAfter = 1
			for i := range c.pages {
				e.enqueue(put("bad", fmt.Sprintf("k%d", i), "v"))
			}
			failing := true
			e.failTargets("bad", &failing)
			e.clock.Set(timeMS(e.inspect(e.source).Alarm.DueMS))
			if ar, err := e.h.Alarm(e.ctx, e.source); err != nil {
				t.Fatalf("alarm: %+v, %v", ar, err)
			}
			ts := e.targetCounts("bad")
			if ts.Pending != uint64(c.pages) {
				t.Errorf("pending %d, want %d", ts.Pending, c.pages)
			}
			if moved := ts.State == relaycore.StateQuarantined && ts.Held == uint64(c.pages); moved != c.moved {
				t.Errorf("state %s, %d held: moved aside %v, want %v", ts.State, ts.Held, moved, c.moved)
			}
		})
	}
}

// The point of it: on a loose store one checkpoint takes out many more of
// a wide fan-out's small pages than the batch's item limit would allow
// (DynamoDB's 100 here), so each target gets more rows per apply.
func TestLooseCheckpointTakesMorePages(t *testing.T) {
	run := func(loose bool) (fires int) {
		caps := relaycore.Capabilities{MaxBatchItems: 100}
		var e *env
		if loose {
			e, _ = newLooseEnv(t, "paid", caps)
		} else {
			e = newEnv(t, "paid")
			e.src = mem.New(caps)
			e.srcF = &faultStore{Store: e.src}
			e.h.Source = e.srcF
		}
		for b := range 10 {
			var rows []relaycore.Row
			for i := range 96 {
				rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%02d", i%32)), fmt.Sprintf("k%d-%d", b, i), "v"))
			}
			e.enqueue(rows...)
		}
		_, total := e.drain(e.source, 20)
		if total.RowsDelivered != 960 {
			t.Fatalf("loose=%v: delivered %d rows, want 960", loose, total.RowsDelivered)
		}
		return total.Fires
	}
	tight, loose := run(false), run(true)
	if loose*2 > tight {
		t.Errorf("960 rows in 320 pages: %d fires on a loose store, %d on a transactional one; want at most half", loose, tight)
	}
}

// The invariant: moving pages aside and redriving them takes pages out the
// loose way too: a quarantine's moves put the held pages and list the
// outbox pages in rs.gone, a redrive that finishes held pages lists them in
// rs.gone_held; no batch deletes a page, every page is deleted loosely,
// and the counts stay exact.
func TestLooseHoldAndRedrive(t *testing.T) {
	e, ls := newLooseEnv(t, "paid", relaycore.Capabilities{})
	inBatch := e.pageApplies()
	failing := true
	for i := range 6 {
		e.enqueue(put("bad", fmt.Sprintf("k%d", i), "v"), put("ok", fmt.Sprintf("k%d", i), "v"))
	}
	e.h.QuarantineAfter = 1
	e.failTargets("bad", &failing)
	e.clock.Set(timeMS(e.inspect(e.source).Alarm.DueMS))
	if _, err := e.h.Alarm(e.ctx, e.source); err != nil {
		t.Fatal(err)
	}
	ts := e.targetCounts("bad")
	if ts.State != relaycore.StateQuarantined || ts.Held != 6 {
		t.Fatalf("bad after its failure: %s, %d held; want quarantined, 6", ts.State, ts.Held)
	}
	// Later rows of the quarantined target join its held rows.
	e.enqueue(put("bad", "k6", "v"))
	e.drain(e.source, 5)
	if ts := e.targetCounts("bad"); ts.Held != 7 {
		t.Fatalf("bad holds %d rows, want 7", ts.Held)
	}
	failing = false
	if _, err := e.h.Release(e.ctx, e.source, "bad", relaycore.Actor{By: "op", Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	_, total := e.drain(e.source, 10)
	if total.RowsDelivered != 7 {
		t.Errorf("the redrive delivered %d rows, want 7", total.RowsDelivered)
	}
	if len(*inBatch) != 0 {
		t.Errorf("batches deleted pages %v; on a loose store they leave through rs.gone and rs.gone_held", *inBatch)
	}
	var held int
	for _, k := range ls.deleted {
		if strings.HasPrefix(k, "u/") {
			held++
		}
	}
	if held != 7 {
		t.Errorf("%d held pages deleted loosely (%v), want 7", held, ls.deleted)
	}
	if left := e.pageKeys(e.source); len(left) != 0 {
		t.Errorf("outbox pages left: %v", left)
	}
	v := e.inspect(e.source)
	if len(v.Held) != 0 || len(v.RS.GoneHeld) != 0 || len(v.RS.Gone) != 0 {
		t.Errorf("after the drain: %d held pages, rs %+v", len(v.Held), v.RS)
	}
	for _, tg := range []relaycore.Partition{"bad", "ok"} {
		want := uint64(6)
		if tg == "bad" {
			want = 7
		}
		if ts := e.targetCounts(tg); ts.Pending != 0 || ts.Held != 0 || ts.Done != want {
			t.Errorf("%s: pending %d, held %d, done %d; want 0, 0, %d", tg, ts.Pending, ts.Held, ts.Done, want)
		}
	}
}
