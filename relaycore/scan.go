package relaycore

import (
	"fmt"
	"slices"
	"strings"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// heldMove is an outbox page of a target that holds, moved aside.
type heldMove struct {
	page Page
	raw  []byte
	// loose: the outbox page leaves through rs.gone (gone.go), so the
	// move takes one item, the put under the held key.
	loose bool
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
	if start < layout.PagePrefix {
		start = layout.PagePrefix
	}
	end := layout.PageKey(cur.CycleEnd + 1)
	after := ""
	stopAt := func(seq uint64, key string) { f.stop, f.stopFrom = seq, key }
	var prevLast uint64 // last seq of the previous page scanned
	for cur.Cursor < cur.CycleEnd {
		pg, err := f.h.Source.Scan(f.ctx, f.source, ScanRequest{Start: start, End: end, After: after, Limit: b.TargetsPerFire + 1})
		if err != nil {
			return fmt.Errorf("fire %s: scan: %w", f.source, err)
		}
		pages, err := f.decodeScanned(pg.Items, blocked)
		if err != nil {
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
				if f.inspectSkipped(rows, page.Key, &inspectLeft) {
					return nil
				}
				continue
			}
			tw := byTarget[page.Target]
			slot, err := f.rec(page.Target)
			if err != nil {
				return err
			}
			if tw == nil && len(blocked) < MaxBlockedTargets && f.backingOff(slot.rec) {
				// Failed lately: blocked, no call, until its back-off passed.
				blocked[page.Target] = true
				f.backoff = append(f.backoff, page.Target)
				if f.inspectSkipped(rows, page.Key, &inspectLeft) {
					return nil
				}
				continue
			}
			if tw == nil && slot.rec.holds() {
				// Its older rows are held (or it is quarantined or paused):
				// this page joins them, whole, so the held rows stay older
				// than anything the target still has in the outbox.
				if len(page.Rows) > moveLeft || !f.move(slot, page, it.Value) {
					stopAt(rows[0].Seq-1, page.Key)
					return nil
				}
				moveLeft -= len(page.Rows)
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
			loose, items, room := f.pageItems(slot, tw)
			items, size = f.failedRoom(slot, &page, items, size)
			n := min(len(rows), inspectLeft, rowsLeft)
			if !room || n == 0 || !f.reserve(slot, items, size) {
				stopAt(rows[0].Seq-1, page.Key)
				return nil
			}
			if tw == nil {
				tw = &targetWork{target: page.Target, loose: loose}
				byTarget[page.Target] = tw
				f.sel = append(f.sel, tw)
			}
			if loose {
				f.goneRoom -= goneEntryBytes
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

// inspectSkipped counts the rows of a blocked target's page (key) as
// inspected, within *left; stop: the budget ended within them, and the
// scan stops after the last one counted.
func (f *fireRun) inspectSkipped(rows []Row, key string, left *int) (stop bool) {
	n := min(len(rows), *left)
	*left -= n
	f.spent.inspected += n
	f.res.RowsInspected += n
	if n < len(rows) {
		f.stop, f.stopFrom = rows[0].Seq+uint64(n)-1, key
		return true
	}
	return false
}

// backingOff reports whether r, an active target of the outbox that failed
// its last round(s), is within its back-off: BackoffBase × 2^(rounds−1)
// (capped at BackoffMax) from its last failure, the schedule a quiet
// source's alarm keeps. Without it every new cycle retried it, and on a
// busy source a cycle starts at nearly every fire: ten quick fires
// quarantined a target about a second after its first failure.
func (f *fireRun) backingOff(r targetRec) bool {
	if r.State != StateActive || r.Held > 0 || r.FailedRounds == 0 || r.LastError == nil {
		return false
	}
	return f.now < r.LastError.AtMS+f.h.backoff(r.FailedRounds).Milliseconds()
}

// move reserves the room to move outbox page (raw) of slot's target aside
// and records the move, or reports that it does not fit: the put under the
// held key and the page's delete, which on a loose store (gone.go) is an
// rs.gone entry instead of an item.
func (f *fireRun) move(slot *recSlot, page Page, raw []byte) bool {
	size := f.caps.ItemSize(f.source, heldKeyFor(page), len(raw)) + f.caps.ItemSize(f.source, page.Key, 0)
	loose := f.loose && f.goneRoom >= goneEntryBytes
	items := 2
	if loose {
		items = 1
	}
	if !f.reserve(slot, items, size) {
		return false
	}
	if loose {
		f.goneRoom -= goneEntryBytes
	}
	f.moves = append(f.moves, heldMove{page: page, raw: raw, loose: loose})
	return true
}

// pageItems is the checkpoint items a selected outbox page of slot's
// target reserves (tw: the target's work so far, nil for its first page).
// One, for the delete or rewrite, except on a loose store (gone.go): there
// the pages of a healthy target that it finishes leave through rs.gone,
// not the batch, and only the one page where its delivery stops can be
// rewritten, so its first page keeps the item for that and the others keep
// none (their bytes stay reserved in full, as for a rewrite); room is
// false when rs.gone is full.
func (f *fireRun) pageItems(slot *recSlot, tw *targetWork) (loose bool, items int, room bool) {
	if !f.loose || slot.rec.FailedRounds > 0 {
		return false, 1, true
	}
	if f.goneRoom < goneEntryBytes {
		return true, 0, false
	}
	if tw != nil {
		return true, 0, true
	}
	return true, 1, true
}

// decodeScanned decodes a page of the scan's items and reads, at once, the
// records of the targets it meets that are not blocked.
func (f *fireRun) decodeScanned(items []Item, blocked map[Partition]bool) ([]Page, error) {
	pages := make([]Page, len(items))
	var met []Partition
	for i, it := range items {
		var err error
		if pages[i], err = decodePage(it.Key, it.Value); err != nil {
			return nil, fmt.Errorf("fire %s: %w", f.source, err)
		}
		if !blocked[pages[i].Target] {
			met = append(met, pages[i].Target)
		}
	}
	// The records of the targets this page of the scan meets, at once.
	if err := f.prefetch(met); err != nil {
		return nil, err
	}
	return pages, nil
}

// failedRoom adds to items and size the room a selected page of a target
// that failed before keeps, to move the page aside should it fail again.
func (f *fireRun) failedRoom(slot *recSlot, page *Page, items, size int) (int, int) {
	if slot.rec.FailedRounds > 0 {
		// It failed before: keep room to move this page aside.
		hi, hb := f.holdExtra(page)
		items, size = items+hi, size+hb
		if !slot.holdRoom {
			// A target the scan selects has no retry marker yet:
			// holding it puts one.
			items, size = items+1, size+f.caps.ItemSize(f.source, retryKey(0, page.Target), 0)
		}
	}
	return items, size
}

// heldKeyFor is where an outbox page goes when it is moved aside: under its
// target's held prefix, with the same original-first-seq suffix.
func heldKeyFor(p Page) string {
	return heldPrefix(p.Target) + strings.TrimPrefix(p.Key, layout.PagePrefix)
}
