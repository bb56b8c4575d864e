package relaycore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
	"github.com/relay-dev/relay/relaycore/sim"
)

// A fire's checkpoint (rs, q, the target records and the deletes and
// rewrites of the pages it collected) must fit the source store's
// batch-byte limit whatever rs holds, so the scan keeps room for the
// largest rs (RSMaxBytes) and q, one target record per selected target,
// and counts each collected page at the size of its rewrite. These tests put a
// checkpoint exactly at that line: 32 blocked targets with the longest
// names at their longest encoding make rs nearly as large as it can be, and
// three partly delivered pages fill the rest of the limit to the byte.

const boundSource relaycore.Partition = "src"

// boundSeed makes the incompressible values; fixed, so the fixture's sizes
// are the same on every run.
const boundSeed = 20261130

// blockedName is the i-th of 32 failing targets: 255 bytes (the longest
// partition name) with a "<", which rs stores in base64, its longest form.
func blockedName(i int) relaycore.Partition {
	p := fmt.Sprintf("blocked-%02d<", i)
	return relaycore.Partition(p + strings.Repeat("y", relaycore.MaxPartitionLen-len(p)))
}

// The healthy targets, in seq order: the checkpoint of the fire after the
// blocking one has room for exactly ta, tb and tc; te comes next.
var boundTargets = []relaycore.Partition{"ta", "tb", "tc", "te"}

// boundRows are a healthy target's rows: two tiny ones first (the one
// target batch a fire gets, three items with rh, delivers just those), then
// large incompressible ones, so the rewrite of the rest is nearly the page.
func boundRows(rng *rand.Rand, t relaycore.Partition, big int) []relaycore.Row {
	var rows []relaycore.Row
	for i := range 2 + big {
		v := []byte("x")
		if i >= 2 {
			v = make([]byte, 480)
			for j := range v {
				v[j] = byte(rng.Uint32())
			}
		}
		rows = append(rows, relaycore.Row{Target: t, Puts: []relaycore.KV{{Key: fmt.Sprintf("k%02d", i), Value: v}}})
	}
	return rows
}

var boundTargetCaps = relaycore.Capabilities{MaxBatchItems: 3, MaxBatchBytes: 1 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 32}

// boundEnv is the fixture with the source store's batch-byte limit set to
// limit, after the first fire, which tried the 32 failing targets and
// blocked them all: rs holds them, the cursor stands before ta's rows.
type boundEnv struct {
	ctx   context.Context
	src   *mem.Store
	srcF  *faultStore
	h     *relaycore.RelayHandler
	caps  relaycore.Capabilities
	limit int
}

func newBoundEnv(t *testing.T, limit int) *boundEnv {
	t.Helper()
	caps := relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: limit, MaxItemBytes: 400 << 10, ItemOverhead: 32}
	e := &boundEnv{ctx: context.Background(), src: mem.New(caps), caps: caps, limit: limit}
	e.srcF = &faultStore{Store: e.src}
	tgtF := &faultStore{Store: mem.New(boundTargetCaps)}
	tgtF.set(func(c call) error {
		if c.Op == "apply" && strings.HasPrefix(string(c.P), "blocked-") {
			return errInjected
		}
		return nil
	}, nil)
	clock := newTestClock()
	e.h = &relaycore.RelayHandler{Source: e.srcF, Target: tgtF, Clock: clock,
		Budget: relaycore.RelayBudget{FiresPerAlarm: 1, TargetsPerFire: relaycore.MaxBlockedTargets, CallsPerTarget: 1, RowsPerFire: 1000}}

	cfg := relaycore.EnqueueConfig{TargetCaps: boundTargetCaps}
	commit := func(rows []relaycore.Row) {
		t.Helper()
		if _, err := relaycore.CommitRelayRows(e.ctx, e.src, clock, boundSource, nil, time.Time{}, rows, cfg); err != nil {
			t.Fatalf("enqueue at limit %d: %v", limit, err)
		}
	}
	var failing []relaycore.Row
	for i := range relaycore.MaxBlockedTargets {
		failing = append(failing, relaycore.Row{Target: blockedName(i), Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}})
	}
	commit(failing)
	rng := rand.New(rand.NewPCG(boundSeed, 0))
	for _, tg := range boundTargets {
		commit(boundRows(rng, tg, 10)) // one page per target
	}

	// The checkpoint keeps room for one record per target it selects, so
	// the 32 are blocked by fires of 4 targets each (which fit any limit
	// the test uses); the fire measured then gets the whole budget.
	full := e.h.Budget
	e.h.Budget.TargetsPerFire = 4
	var res relaycore.FireResult
	for f := 0; f < relaycore.MaxBlockedTargets && res.Blocked < relaycore.MaxBlockedTargets; f++ {
		var err error
		if res, err = e.h.Fire(e.ctx, boundSource); err != nil {
			t.Fatalf("limit %d: blocking fire: %v", limit, err)
		}
	}
	e.h.Budget = full
	if res.Blocked != relaycore.MaxBlockedTargets || res.Cursor != uint64(relaycore.MaxBlockedTargets) {
		t.Fatalf("limit %d: blocking fires left %d blocked, cursor %d; want %d, %d (%+v)", limit, res.Blocked, res.Cursor, relaycore.MaxBlockedTargets, relaycore.MaxBlockedTargets, res)
	}
	return e
}

// recRoom is what the scan reserves for a selected target's record.
func (e *boundEnv) recRoom(t relaycore.Partition) int {
	return e.caps.ItemSize(boundSource, relaycore.TargetStateKey(t), relaycore.TargetRecMaxBytes)
}

// reserved is what the scan counts for each healthy target's page: its
// rewrite bound as a source item.
func (e *boundEnv) reserved(t *testing.T) map[relaycore.Partition]int {
	t.Helper()
	v, err := relaycore.InspectSource(e.ctx, e.src, boundSource)
	if err != nil {
		t.Fatal(err)
	}
	out := map[relaycore.Partition]int{}
	for _, pg := range v.Pages {
		raw, _, err := e.src.Get(e.ctx, boundSource, pg.Key)
		if err != nil {
			t.Fatal(err)
		}
		out[pg.Target] = e.caps.ItemSize(boundSource, pg.Key, max(len(raw), relaycore.PageRewriteBound(pg)))
	}
	return out
}

// fire runs the second fire and returns its result and the checkpoint it
// sent (rs guarded, with page writes).
func (e *boundEnv) fire(t *testing.T) (relaycore.FireResult, relaycore.Batch) {
	t.Helper()
	var cp relaycore.Batch
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && len(c.Batch.Preconditions) == 1 && c.Batch.Preconditions[0].Key == relaycore.KeyRS && len(c.Batch.Writes) > 1 {
			cp = c.Batch
		}
		return nil
	}, nil)
	res, err := e.h.Fire(e.ctx, boundSource)
	if err != nil {
		t.Fatalf("limit %d: fire: %v", e.limit, err)
	}
	return res, cp
}

func (e *boundEnv) size(b relaycore.Batch) (total, rs int) {
	for _, w := range b.Writes {
		n := e.caps.ItemSize(boundSource, w.Key, len(w.Value))
		total += n
		if w.Key == relaycore.KeyRS {
			rs = n
		}
	}
	return total, rs
}

// TestCheckpointAtBatchLimit: with the limit exactly the largest rs plus
// the three pages ta, tb and tc, the fire collects those three (not te),
// delivers part of each and commits a checkpoint that rewrites all three
// beside an rs of 32 longest blocked names. One byte less and tc's page is
// left for the next fire. A scan that kept no room for rs would also take
// te's page, and its checkpoint would exceed the limit.
func TestCheckpointAtBatchLimit(t *testing.T) {
	t.Logf("values from PCG seed %d", boundSeed)
	probe := newBoundEnv(t, 4<<20)
	reserved := probe.reserved(t)
	// rs keeps room for folded progress by the batch limit's step: the
	// limits below are all in the one for 32..64 KB.
	rsRoom := probe.caps.ItemSize(boundSource, relaycore.KeyRS, relaycore.RSBound(relaycore.Capabilities{MaxBatchBytes: 32 << 10})) + probe.caps.ItemSize(boundSource, layout.KeyHold, relaycore.HoldMaxBytes)
	recRooms := probe.recRoom("ta") + probe.recRoom("tb") + probe.recRoom("tc")
	limit := rsRoom + recRooms + reserved["ta"] + reserved["tb"] + reserved["tc"]
	if reserved["te"] >= rsRoom {
		t.Fatalf("fixture: te's page (%d bytes) must fit the rs room (%d) so that a scan without it would take te", reserved["te"], rsRoom)
	}

	for _, tc := range []struct {
		name    string
		limit   int
		targets int
	}{
		{"exactly at the limit", limit, 3},
		{"one byte over", limit - 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBoundEnv(t, tc.limit)
			res, cp := e.fire(t)
			if res.Busy || res.TargetsAttempted != tc.targets || res.TargetsBlocked != 0 {
				t.Fatalf("limit %d: fire attempted %d targets (blocked %d, busy %v), want %d: %+v", tc.limit, res.TargetsAttempted, res.TargetsBlocked, res.Busy, tc.targets, res)
			}
			if res.RowsDelivered != 2*tc.targets || res.Blocked != relaycore.MaxBlockedTargets {
				t.Fatalf("limit %d: delivered %d rows with %d blocked, want %d and %d", tc.limit, res.RowsDelivered, res.Blocked, 2*tc.targets, relaycore.MaxBlockedTargets)
			}
			rewrites := 0
			for _, w := range cp.Writes {
				if strings.HasPrefix(w.Key, layout.PagePrefix) && !w.Delete {
					rewrites++
				}
			}
			if rewrites != tc.targets {
				t.Fatalf("limit %d: checkpoint rewrote %d pages, want %d", tc.limit, rewrites, tc.targets)
			}
			total, rs := e.size(cp)
			t.Logf("limit %d (rs room %d + pages %d): checkpoint %d bytes, rs %d, %d bytes to spare", tc.limit, rsRoom, tc.limit-rsRoom, total, rs, tc.limit-total)
			if total > tc.limit {
				t.Fatalf("checkpoint of %d bytes over the limit %d", total, tc.limit)
			}
			// The fixture is only a boundary if rs takes nearly all of its
			// room and the rewrites nearly all of theirs.
			// (Target records are reserved at their largest and written
			// small or folded into rs, whose room for folded progress is
			// reserved at its largest, and q is reserved but unchanged here.)
			// So is the idle sweep's cursor, empty here.
			foldRoom := relaycore.RSBound(relaycore.Capabilities{MaxBatchBytes: 32 << 10}) - relaycore.RSMaxBytes
			cursorRoom := len(`,"sweep_after":"t//~"`) + 2*relaycore.MaxPartitionLen
			if tc.targets == 3 && tc.limit-total > 1024+foldRoom+cursorRoom+recRooms+probe.caps.ItemSize(boundSource, layout.KeyHold, relaycore.HoldMaxBytes) {
				t.Fatalf("fixture: checkpoint leaves %d of %d bytes unused; it should sit near the limit", tc.limit-total, tc.limit)
			}
			// The rows left behind are delivered by later fires.
			v, err := relaycore.InspectSource(e.ctx, e.src, boundSource)
			if err != nil {
				t.Fatal(err)
			}
			want := relaycore.MaxBlockedTargets + 4*12 - 2*tc.targets
			if n := len(v.Rows()); n != want {
				t.Fatalf("%d rows left, want %d", n, want)
			}
		})
	}
}

// TestSimRSMaxBytes keeps the simulation's copy of the rs bound equal to
// the engine's: the simulation checks every checkpoint's page writes
// against the room beside it.
func TestSimRSMaxBytes(t *testing.T) {
	if sim.RSMaxBytes != relaycore.RSMaxBytes {
		t.Fatalf("sim.RSMaxBytes = %d, the engine's rsMaxBytes = %d: update relaycore/sim/bulk.go", sim.RSMaxBytes, relaycore.RSMaxBytes)
	}
}

// The same line for the item limit: a checkpoint keeps an item each for
// rs and q, and each target it selects takes one for its record and one per
// collected page, so with MaxBatchItems = 2 + 2n + 1 a fire delivers
// exactly n one-page targets (the spare item holds no record and page),
// and its checkpoint stays within the limit. Counting one item fewer for
// rs and q would take a target more.
func TestCheckpointAtBatchItemLimit(t *testing.T) {
	const n = 3
	caps := relaycore.Capabilities{MaxBatchItems: 2 + 2*n + 1, MaxBatchBytes: 1 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 32}
	e := newEnv(t, "paid")
	e.src = mem.New(caps)
	e.srcF = &faultStore{Store: e.src}
	e.h.Source = e.srcF
	for i := range n + 3 {
		e.enqueue(put(relaycore.Partition(fmt.Sprintf("t%d", i)), "k", "v"))
	}
	items := 0
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && len(c.Batch.Writes) > 1 && c.Batch.Writes[0].Key == relaycore.KeyRS {
			items = len(c.Batch.Writes)
			for _, p := range c.Batch.Preconditions {
				if !slices.ContainsFunc(c.Batch.Writes, func(w relaycore.Write) bool { return w.Key == p.Key }) {
					items++
				}
			}
		}
		return nil
	}, nil)
	res, err := e.h.Fire(e.ctx, e.source)
	if err != nil || res.TargetsAttempted != n || res.RowsCleaned != n {
		t.Fatalf("fire: %+v, %v; want %d targets delivered and cleaned", res, err, n)
	}
	t.Logf("checkpoint of %d items, limit %d", items, caps.MaxBatchItems)
	if items < 1+n || items > caps.MaxBatchItems {
		t.Fatalf("checkpoint of %d items, want rs and %d page deletes within the limit %d", items, n, caps.MaxBatchItems)
	}
}
