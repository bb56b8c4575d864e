package relaycore

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// fireRun is one attempt of a fire: what it claimed, what it read, the work
// it selected and the room left in its checkpoint batch.
type fireRun struct {
	h      *RelayHandler
	ctx    context.Context
	source Partition
	b      RelayBudget
	now    int64
	caps   Capabilities
	res    *FireResult
	spent  *fireSpend
	start  claimed
	cur    RelayState

	recs map[Partition]*recSlot // target records read this attempt

	redrive []*targetWork // targets served from held pages (retries, redrives)
	sel     []*targetWork // targets selected by the outbox scan
	moves   []heldMove    // outbox pages moved aside (targets that hold)

	stop     uint64 // the scan's stop: the new cursor unless a target pauses it earlier
	stopFrom string

	// dueLeft: due retry markers this attempt did not serve (the source has
	// more to do); nextDue: the earliest marker not yet due.
	dueLeft bool
	nextDue int64
	// heldFirst: due held rows went first this fire (collect's turns);
	// the checkpoint records it in rs when held rows were due.
	heldFirst bool
	turnTaken bool

	itemsRoom, bytesRoom int
	// capItems/capBytes (when > 0) bound what the current collection
	// phase may reserve beyond its first reservation (collect's fair
	// split); usedItems/usedBytes count what it reserved.
	capItems, capBytes   int
	usedItems, usedBytes int
}

// recSlot is a target record as read and as it will be written.
type recSlot struct {
	before, rec targetRec
	found       bool
	reserved    bool   // checkpoint room is reserved for its write
	marker      string // its retry marker key as found (served or stale)
	// holdRoom: room is reserved to move its selected pages aside (and put
	// a retry marker) should it fail: it failed before, so it may again.
	holdRoom bool
}

// heldMove is an outbox page of a target that holds, moved aside.
type heldMove struct {
	page Page
	raw  []byte
}

// targetRecMaxBytes bounds an encoded target record: bounded strings
// (error message, reason, actor) written by encodeJSON, at most two bytes
// per input byte once sanitized, plus the numeric fields.
const targetRecMaxBytes = 640 + 2*(maxErrorMessage+8) + 2*(MaxReasonLen+8) + 2*(MaxActorLen+8)

// holdMaxBytes bounds the encoded q record.
const holdMaxBytes = 400

// CheckpointReserve is the room (as the store's item sizes) a fire
// checkpoint keeps for rs, q, one target record and two retry markers, and
// for moving a page aside (the delete of its outbox key and the longer held
// key), besides the page itself: a page that fits beside it can always be
// collected, rewritten or moved aside by a fire that meets it first, so
// enqueue plans pages within MaxBatchBytes − CheckpointReserve.
func CheckpointReserve(source Partition, caps Capabilities) int {
	long := Partition(strings.Repeat("x", MaxPartitionLen))
	return caps.ItemSize(source, KeyRS, rsMaxBytes) + caps.ItemSize(source, KeyHold, holdMaxBytes) +
		caps.ItemSize(source, targetStateKey(long), targetRecMaxBytes) + 2*caps.ItemSize(source, retryKey(0, long), 0) +
		caps.ItemSize(source, heldPageKey(long, 0), 0) + caps.ItemSize(source, PageKey(0), 0)
}

func (h *RelayHandler) newFireRun(ctx context.Context, source Partition, start claimed, now int64, spent *fireSpend, res *FireResult) *fireRun {
	f := &fireRun{h: h, ctx: ctx, source: source, b: h.budget(), now: now, caps: h.Source.Capabilities(),
		res: res, spent: spent, start: start, cur: start.rs.RelayState, recs: map[Partition]*recSlot{}}
	f.itemsRoom, f.bytesRoom = 1<<30, 1<<30
	if f.caps.MaxBatchItems > 0 {
		f.itemsRoom = f.caps.MaxBatchItems - 2 // rs and q
	}
	if f.caps.MaxBatchBytes > 0 {
		f.bytesRoom = f.caps.MaxBatchBytes - f.caps.ItemSize(source, KeyRS, rsMaxBytes) - f.caps.ItemSize(source, KeyHold, holdMaxBytes)
	}
	f.cur.Claim = start.rs.Claim
	return f
}

// rec returns target's record, reading it on first use.
func (f *fireRun) rec(t Partition) (*recSlot, error) {
	if s, ok := f.recs[t]; ok {
		return s, nil
	}
	raw, found, err := f.h.Source.Get(f.ctx, f.source, targetStateKey(t))
	if err != nil {
		return nil, fmt.Errorf("fire %s: read target state %q: %w", f.source, t, err)
	}
	r, err := decodeTargetRec(t, raw, found)
	if err != nil {
		return nil, fmt.Errorf("fire %s: %w", f.source, err)
	}
	s := &recSlot{before: r, rec: r, found: found}
	f.recs[t] = s
	return s, nil
}

// prefetch reads, in one batch read, the records of targets not read yet.
func (f *fireRun) prefetch(targets []Partition) error {
	var todo []Partition
	for _, t := range targets {
		if _, ok := f.recs[t]; !ok && !slices.Contains(todo, t) {
			todo = append(todo, t)
		}
	}
	if len(todo) < 2 {
		return nil // rec reads a single one with Get
	}
	keys := make([]string, len(todo))
	for i, t := range todo {
		keys[i] = targetStateKey(t)
	}
	vals, err := GetMany(f.ctx, f.h.Source, f.source, keys)
	if err != nil {
		return fmt.Errorf("fire %s: read target states: %w", f.source, err)
	}
	for i, t := range todo {
		raw, found := vals[keys[i]]
		r, err := decodeTargetRec(t, raw, found)
		if err != nil {
			return fmt.Errorf("fire %s: %w", f.source, err)
		}
		f.recs[t] = &recSlot{before: r, rec: r, found: found}
	}
	return nil
}

// recRoom is the checkpoint room a target record write takes.
func (f *fireRun) recRoom(t Partition) (int, int) {
	return 1, f.caps.ItemSize(f.source, targetStateKey(t), targetRecMaxBytes)
}

// markerRoom is the room a retry marker's delete and put take.
func (f *fireRun) markerRoom(t Partition) (int, int) {
	return 2, 2 * f.caps.ItemSize(f.source, retryKey(0, t), 0)
}

// holdExtra is the room moving a collected outbox page aside takes beyond
// what its delete-or-rewrite reserved: the put under the held key.
func (f *fireRun) holdExtra(pg *Page) (int, int) {
	bound := pageRewriteBound(*pg)
	return 1, f.caps.ItemSize(f.source, heldKeyFor(*pg), bound) + f.caps.ItemSize(f.source, pg.Key, 0) - f.caps.ItemSize(f.source, pg.Key, bound)
}

// reserve takes items and bytes of checkpoint room, plus the target
// record's room the first time, or reports that they do not fit.
func (f *fireRun) reserve(s *recSlot, items, bytes int) bool {
	if !s.reserved {
		ri, rb := f.recRoom(s.rec.Target)
		items, bytes = items+ri, bytes+rb
	}
	if items > f.itemsRoom || bytes > f.bytesRoom {
		return false
	}
	if f.capItems > 0 && (f.usedItems > 0 || f.usedBytes > 0) && (f.usedItems+items > f.capItems || f.usedBytes+bytes > f.capBytes) {
		return false
	}
	f.itemsRoom -= items
	f.bytesRoom -= bytes
	f.usedItems += items
	f.usedBytes += bytes
	s.reserved = true
	return true
}

// scan walks the cycle's pages in seq order from rs.from, selecting up to
// targetsLeft targets and rowsLeft rows and moving aside the pages of
// targets that hold (quarantined, paused, or with held rows).
func (f *fireRun) scan(targetsLeft, rowsLeft int) error {
	b, cur, res, spent := f.b, f.cur, f.res, f.spent
	blocked := make(map[Partition]bool, len(cur.Blocked))
	for _, t := range cur.Blocked {
		blocked[t] = true
	}
	byTarget := map[Partition]*targetWork{}
	inspectLeft := max(0, b.inspectPerFire()-spent.inspected)
	// Moving pages aside spends no target budget and no inspection budget of
	// the healthy targets, but has its own cap of the same size.
	moveLeft := b.inspectPerFire()
	f.stop, f.stopFrom = cur.CycleEnd, ""
	start := cur.From
	if start < PagePrefix {
		start = PagePrefix
	}
	end := PageKey(cur.CycleEnd + 1)
	after := ""
	stopAt := func(seq uint64, key string) { f.stop, f.stopFrom = seq, key }
	var prevLast uint64 // last seq of the previous page scanned
	for cur.Cursor < cur.CycleEnd {
		pg, err := f.h.Source.Scan(f.ctx, f.source, ScanRequest{Start: start, End: end, After: after, Limit: b.TargetsPerFire + 1})
		if err != nil {
			return fmt.Errorf("fire %s: scan: %w", f.source, err)
		}
		pages := make([]Page, len(pg.Items))
		var met []Partition
		for i, it := range pg.Items {
			if pages[i], err = DecodePage(it.Key, it.Value); err != nil {
				return fmt.Errorf("fire %s: %w", f.source, err)
			}
			if !blocked[pages[i].Target] {
				met = append(met, pages[i].Target)
			}
		}
		// The records of the targets this page of the scan meets, at once.
		if err := f.prefetch(met); err != nil {
			return err
		}
		for i, it := range pg.Items {
			page := pages[i]
			// A page keyed within the cycle came from a batch committed
			// before the cycle started, and pages hold disjoint ascending
			// seq ranges in key order. Delivering a row that breaks this
			// would move rh past seqs that later rows get, and those would
			// be skipped as applied: fail closed instead.
			if page.Last() > cur.CycleEnd || page.First <= prevLast {
				return fmt.Errorf("fire %s: %w: page %s holds seqs %d..%d, outside the cycle (through %d) or not after seq %d",
					f.source, ErrCorruptRecord, page.Key, page.First, page.Last(), cur.CycleEnd, prevLast)
			}
			prevLast = page.Last()
			i, _ := slices.BinarySearchFunc(page.Rows, cur.Cursor+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
			rows := page.Rows[i:]
			if len(rows) == 0 {
				continue // rows at or below the cursor: blocked targets'
			}
			if blocked[page.Target] {
				n := min(len(rows), inspectLeft)
				inspectLeft -= n
				spent.inspected += n
				res.RowsInspected += n
				if n < len(rows) {
					stopAt(rows[0].Seq+uint64(n)-1, page.Key)
					return nil
				}
				continue
			}
			tw := byTarget[page.Target]
			slot, err := f.rec(page.Target)
			if err != nil {
				return err
			}
			if tw == nil && slot.rec.holds() {
				// Its older rows are held (or it is quarantined or paused):
				// this page joins them, whole, so the held rows stay older
				// than anything the target still has in the outbox.
				size := f.caps.ItemSize(f.source, heldKeyFor(page), len(it.Value)) + f.caps.ItemSize(f.source, page.Key, 0)
				if len(page.Rows) > moveLeft || !f.reserve(slot, 2, size) {
					stopAt(rows[0].Seq-1, page.Key)
					return nil
				}
				moveLeft -= len(page.Rows)
				f.moves = append(f.moves, heldMove{page: page, raw: it.Value})
				continue
			}
			// The checkpoint deletes the page or rewrites its remaining rows;
			// a rewrite may compress worse than the stored page, never beyond
			// the rows with full keys uncompressed.
			size := f.caps.ItemSize(f.source, page.Key, max(len(it.Value), pageRewriteBound(page)))
			if tw == nil && targetsLeft <= len(f.sel) {
				stopAt(rows[0].Seq-1, page.Key)
				return nil
			}
			items := 1
			if slot.rec.FailedRounds > 0 {
				// It failed before: keep room to move this page aside.
				hi, hb := f.holdExtra(&page)
				items, size = items+hi, size+hb
				if !slot.holdRoom {
					// A target the scan selects has no retry marker yet:
					// holding it puts one.
					items, size = items+1, size+f.caps.ItemSize(f.source, retryKey(0, page.Target), 0)
				}
			}
			n := min(len(rows), inspectLeft, rowsLeft)
			if n == 0 || !f.reserve(slot, items, size) {
				stopAt(rows[0].Seq-1, page.Key)
				return nil
			}
			if tw == nil {
				tw = &targetWork{target: page.Target}
				byTarget[page.Target] = tw
				f.sel = append(f.sel, tw)
			}
			slot.holdRoom = slot.rec.FailedRounds > 0
			pageCopy := page
			tw.pages = append(tw.pages, &pageCopy)
			tw.rows = append(tw.rows, rows[:n]...)
			inspectLeft -= n
			spent.inspected += n
			rowsLeft -= n
			res.RowsInspected += n
			if n < len(rows) {
				stopAt(rows[n-1].Seq, page.Key)
				return nil
			}
		}
		if pg.Next == "" {
			return nil
		}
		after = pg.Next
	}
	return nil
}

// heldKeyFor is where an outbox page goes when it is moved aside: under its
// target's held prefix, with the same original-first-seq suffix.
func heldKeyFor(p Page) string {
	return heldPrefix(p.Target) + strings.TrimPrefix(p.Key, PagePrefix)
}
