package relaycore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

func TestRegressionEnqueueValidation(t *testing.T) {
	big := strings.Repeat("x", 400<<10)
	many := relaycore.Row{Target: "t"}
	for i := 0; i < 99; i++ {
		many.Puts = append(many.Puts, relaycore.KV{Key: fmt.Sprintf("k%02d", i), Value: []byte("v")})
	}
	cases := []struct {
		name   string
		row    relaycore.Row
		reason string
	}{
		{"empty target", put("", "k", "v"), "target name is missing or empty"},
		{"long target", put(relaycore.Partition(strings.Repeat("t", 256)), "k", "v"), "target name"},
		{"reserved target", put("_relay/x", "k", "v"), "reserved prefix"},
		{"target is source", put("src-a", "k", "v"), "source itself"},
		{"no writes", relaycore.Row{Target: "t"}, "no puts and no deletes"},
		{"put and delete", relaycore.Row{Target: "t", Puts: []relaycore.KV{{Key: "k"}}, Deletes: []string{"k"}}, "both put and deleted"},
		{"duplicate put", put("t", "k", "1", "k", "2"), "duplicate key"},
		{"duplicate delete", del("t", "k", "k"), "duplicate key"},
		{"empty key", put("t", "", "v"), "empty key"},
		{"reserved key", put("t", "_relay/rh/src-a", "9"), "reserved prefix"},
		{"long key", put("t", strings.Repeat("k", 1025), "v"), "limit 1024"},
		{"too many keys", many, "keys, limit 98"},
		{"oversize value", put("t", "k", big), "as a target item"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "free")
			rows := []relaycore.Row{put("ok", "k", "v"), c.row}
			_, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{})
			var re *relaycore.RowError
			if !errors.As(err, &re) || !errors.Is(err, relaycore.ErrInvalidRow) {
				t.Fatalf("err = %v, want a *RowError wrapping ErrInvalidRow", err)
			}
			if re.Index != 1 || !strings.Contains(re.Reason, c.reason) {
				t.Fatalf("row error %+v, want index 1 and reason containing %q", re, c.reason)
			}
			if d := e.src.Dump(); len(d) != 0 {
				t.Fatalf("something was written: %v", d)
			}
		})
	}
	t.Run("key too long once widened by the target store", func(t *testing.T) {
		e := newEnv(t, "free")
		wide := relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 23, WideNonASCII: true}
		key := strings.Repeat("é", 300) // 600 bytes, 1200 as DynamoDB keeps it
		_, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{},
			[]relaycore.Row{put("t", key, "v")}, relaycore.EnqueueConfig{TargetCaps: wide})
		var re *relaycore.RowError
		if !errors.As(err, &re) || !strings.Contains(re.Reason, "as stored by the target store") {
			t.Fatalf("err = %v, want a row error for the widened key length", err)
		}
		if _, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{},
			[]relaycore.Row{put("t", key, "v")}, relaycore.EnqueueConfig{}); err != nil {
			t.Fatalf("the same key on a store that keeps bytes as they are: %v", err)
		}
	})
	t.Run("98 keys fit", func(t *testing.T) {
		e := newEnv(t, "free")
		many.Puts = many.Puts[:98]
		e.enqueue(many)
		e.drain(e.source, 5)
		if v, _ := e.target("t", "k97"); v != "v" {
			t.Fatal("98-key row not delivered")
		}
	})
}

// chainRows is enough rows for several enqueue batches (one page per target).
func chainRows(n int, tag string) []relaycore.Row {
	rows := make([]relaycore.Row, n)
	for i := range rows {
		rows[i] = put(relaycore.Partition(fmt.Sprintf("t%03d", i%60)), fmt.Sprintf("%s%d", tag, i), "v")
	}
	return rows
}

func TestRegressionOSRaceReplansOnlySuffix(t *testing.T) {
	e := newEnv(t, "free")
	rows := chainRows(300, "a") // 60 targets, a page and a target record each: two batches
	sourceApplies := 0
	e.srcF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		sourceApplies++
		if sourceApplies == 2 { // before our second batch: another writer wins os
			e.enqueue(put("other", "o", "1"), put("other", "o", "2"))
		}
		return nil
	}, nil)
	res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{})
	e.srcF.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Replans != 1 {
		t.Fatalf("replans = %d, want 1", res.Replans)
	}
	// Seqs: ours and the other writer's 2 are exactly 1..302, each once.
	all := append(slices.Clone(res.Seqs), 0, 0)
	v := e.inspect(e.source)
	for _, r := range v.Rows() {
		if r.Target == "other" {
			all[len(all)-1-int(r.Seq%2)] = r.Seq
		}
	}
	slices.Sort(all)
	for i, s := range all {
		if s != uint64(i+1) {
			t.Fatalf("seqs are not exactly 1..302: position %d has %d", i, s)
		}
	}
	// Rows committed by the first batch kept their seqs (only the suffix was
	// re-planned): the first batch's seqs are 1..k, with the other writer's
	// right after.
	other := []uint64{}
	for _, r := range v.Rows() {
		if r.Target == "other" {
			other = append(other, r.Seq)
		}
	}
	firstBatch := 0
	for _, s := range res.Seqs {
		if s < other[0] {
			firstBatch++
		}
	}
	if firstBatch == 0 || firstBatch == len(rows) {
		t.Fatalf("first batch committed %d rows; the race should split the chain", firstBatch)
	}
	// Per-target order: for each target, input order == seq order.
	last := map[relaycore.Partition]uint64{}
	for i, r := range rows {
		if res.Seqs[i] <= last[r.Target] {
			t.Fatalf("row %d of %s got seq %d after %d", i, r.Target, res.Seqs[i], last[r.Target])
		}
		last[r.Target] = res.Seqs[i]
	}
	if n := len(v.Rows()); n != 302 {
		t.Fatalf("%d rows in outbox, want 302", n)
	}
}

func TestRegressionAmbiguousEnqueueResolved(t *testing.T) {
	cases := []struct {
		name string
		// after the batch's real apply: what else happens before the caller learns the outcome
		racer  bool
		lost   bool // the batch is not applied at all (timeout before landing)
		wantOK bool
	}{
		{name: "landed, os unchanged since", wantOK: true},
		{name: "landed, another writer followed", racer: true, wantOK: true},
		{name: "not landed, resent", lost: true, wantOK: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "free")
			done := false
			before := func(cl call) error {
				if cl.Op == "apply" && c.lost && !done {
					done = true
					return maybeApplied()
				}
				return nil
			}
			after := func(cl call) error {
				if cl.Op == "apply" && !c.lost && !done {
					done = true
					if c.racer {
						e.enqueue(put("other", "o", "1"))
					}
					return maybeApplied()
				}
				return nil
			}
			e.srcF.set(before, after)
			res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueConfig{})
			e.srcF.set(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			v := e.inspect(e.source)
			rows := v.Rows()
			var ours []uint64
			for _, r := range rows {
				if r.Target == "t" {
					ours = append(ours, r.Seq)
				}
			}
			if len(ours) != 1 || ours[0] != res.Seqs[0] {
				t.Fatalf("our row stored at seqs %v, result says %d: duplicated or lost", ours, res.Seqs[0])
			}
			if int(v.OS.NextSeq-1) != len(rows) {
				t.Fatalf("os.next = %d with %d rows: a seq was lost", v.OS.NextSeq, len(rows))
			}
		})
	}
}

func TestRegressionStaleLeaseAndDeadlineFailClosed(t *testing.T) {
	e := newEnv(t, "free")
	now := e.clock.Now()
	l1, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-1", 10*time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-2", 10*time.Second, now); !errors.Is(err, relaycore.ErrLeaseHeld) {
		t.Fatalf("second holder acquired a live lease: %v", err)
	}
	commit := func(l *relaycore.Lease, deadline time.Time) (relaycore.CommitResult, error) {
		return relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, l, deadline, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueConfig{})
	}
	if _, err := commit(&l1, time.Time{}); err != nil {
		t.Fatalf("holder's enqueue: %v", err)
	}
	if _, err := commit(&l1, now); !errors.Is(err, relaycore.ErrDeadlineExceeded) {
		t.Fatalf("passed caller deadline: err = %v", err)
	}
	e.clock.Advance(8*time.Second + 1) // within the 2s skew margin of expiry
	if _, err := commit(&l1, time.Time{}); !errors.Is(err, relaycore.ErrDeadlineExceeded) {
		t.Fatalf("lease within skew margin: err = %v", err)
	}
	e.clock.Advance(3 * time.Second)
	l2, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-2", 10*time.Second, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.inspect(e.source).Rows())
	if _, err := commit(&l1, time.Time{}); !errors.Is(err, relaycore.ErrStaleLease) {
		t.Fatalf("stale lease: err = %v", err)
	}
	// Lease taken over between the snapshot and the batch: the batch's lease
	// precondition fails closed.
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			_, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-2", 10*time.Second, e.clock.Now())
			return err
		}
		return nil
	}, nil)
	if _, err := commit(&l2, time.Time{}); !errors.Is(err, relaycore.ErrStaleLease) {
		t.Fatalf("lease lost mid-commit: err = %v", err)
	}
	e.srcF.set(nil, nil)
	// Deadline passing between the snapshot and the batch.
	l3, _ := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-2", 10*time.Second, e.clock.Now())
	e.srcF.set(func(c call) error {
		if c.Op == "scan" && c.Key == relaycore.KeyAlarm { // the snapshot's read of alarm, lease and os
			e.clock.Advance(time.Minute)
		}
		return nil
	}, nil)
	if _, err := commit(&l3, time.Time{}); !errors.Is(err, relaycore.ErrDeadlineExceeded) {
		t.Fatalf("deadline passed before send: err = %v", err)
	}
	e.srcF.set(nil, nil)
	if after := len(e.inspect(e.source).Rows()); after != before {
		t.Fatalf("failed-closed enqueues wrote %d rows", after-before)
	}
}

func TestRegressionLeaseRequiredRefusedWithoutLease(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "before"))
	if err := relaycore.DeclareLeaseRequired(e.ctx, e.src, e.source); err != nil {
		t.Fatal(err)
	}
	if err := relaycore.DeclareLeaseRequired(e.ctx, e.src, e.source); err != nil {
		t.Fatalf("idempotent declare: %v", err)
	}
	rows := []relaycore.Row{put("t", "k", "v")}
	if _, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{}); !errors.Is(err, relaycore.ErrLeaseRequired) {
		t.Fatalf("err = %v, want ErrLeaseRequired", err)
	}
	snap, err := relaycore.ReadEnqueueSnapshot(e.ctx, e.src, e.source, nil, time.Time{}, e.clock.Now(), relaycore.EnqueueConfig{})
	if !errors.Is(err, relaycore.ErrLeaseRequired) {
		t.Fatalf("snapshot err = %v", err)
	}
	if _, err := relaycore.EnqueueRelayRows(snap, rows, e.src.Capabilities(), relaycore.EnqueueConfig{}); !errors.Is(err, relaycore.ErrLeaseRequired) {
		t.Fatalf("plan err = %v", err)
	}
	l, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "w", time.Minute, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, &l, time.Time{}, rows, relaycore.EnqueueConfig{}); err != nil {
		t.Fatalf("with lease: %v", err)
	}
	if n := len(e.inspect(e.source).Rows()); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

func TestRegressionQueries(t *testing.T) {
	e := newEnv(t, "free")
	st := func() relaycore.SourceState {
		s, err := relaycore.SourceRelayState(e.ctx, e.src, e.source, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	through := func(seq uint64) bool {
		ok, err := relaycore.RelayDeliveredThrough(e.ctx, e.src, e.source, seq)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if s := st(); !s.Empty || s.LowerBoundMS != 0 {
		t.Fatalf("fresh source: %+v", s)
	}
	if through(1) {
		t.Fatal("delivered through 1 before any commit")
	}
	t0 := e.clock.Now().UnixMilli()
	e.enqueue(put("bad", "k", "1"))
	e.clock.Advance(time.Second)
	e.enqueue(put("good", "k", "1"))
	if s := st(); s.Empty || s.LowerBoundMS != t0 || s.FirstUndelivered != 1 {
		t.Fatalf("state %+v, want lower bound %d", s, t0)
	}
	failing := true
	e.failTargets("bad", &failing)
	e.fire(e.source)
	// good (seq 2) left, bad (seq 1) did not: through(2) false, watermark t0.
	if through(1) || through(2) {
		t.Fatal("delivered-through true while seq 1 is queued")
	}
	if w, _ := relaycore.RelayWatermark(e.ctx, e.src, e.source, e.clock.Now()); w != t0 {
		t.Fatalf("watermark %d, want %d", w, t0)
	}
	failing = false
	e.drain(e.source, 10)
	if !through(2) || through(3) {
		t.Fatal("after drain: want delivered through 2 and not 3 (never committed)")
	}
	if s := st(); !s.Empty || s.LowerBoundMS != t0+1000 {
		t.Fatalf("drained state %+v, want lower bound = last commit %d", s, t0+1000)
	}
	if rh, _ := relaycore.TargetWatermark(e.ctx, e.tgt, "good", e.source); rh != 2 {
		t.Fatalf("rh(good) = %d", rh)
	}
	// Commit times are monotonic even if the clock steps back.
	back := newTestClock()
	back.now = e.clock.Now().Add(-time.Hour)
	res, err := relaycore.CommitRelayRows(e.ctx, e.src, back, e.source, nil, time.Time{}, []relaycore.Row{put("good", "k", "2")}, relaycore.EnqueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rows := e.inspect(e.source).Rows(); len(rows) != 1 || rows[0].CommitMS != t0+1000 {
		t.Fatalf("commit with a clock behind: rows %+v; want commit time %d", rows, t0+1000)
	}
	// Its wake-up is due by the writer's own clock (already due for it).
	if res.AlarmDueMS > back.Now().UnixMilli() {
		t.Fatalf("alarm due %d, after the writer's now %d", res.AlarmDueMS, back.Now().UnixMilli())
	}
}

func TestPlanBudget(t *testing.T) {
	for _, c := range []struct {
		plan string
		want relaycore.RelayBudget
	}{
		{"free", relaycore.RelayBudget{FiresPerAlarm: 2, TargetsPerFire: 8, CallsPerTarget: 2, RowsPerFire: 256}},
		{"PAID", relaycore.RelayBudget{FiresPerAlarm: 8, TargetsPerFire: 32, CallsPerTarget: 2, RowsPerFire: 1024}},
	} {
		got, err := relaycore.PlanBudget(c.plan)
		if err != nil || got != c.want {
			t.Fatalf("PlanBudget(%q) = %+v, %v", c.plan, got, err)
		}
	}
	if got, _ := relaycore.PlanBudget("free"); got.TargetCallsPerAlarm() != 32 {
		t.Fatal("free plan must stay at 32 target calls per alarm")
	}
	if _, err := relaycore.PlanBudget("enterprise"); !errors.Is(err, relaycore.ErrUnknownPlan) {
		t.Fatalf("err = %v", err)
	}
}
