package relaycore

import (
	"fmt"
	"slices"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// redriveShare is how many targets of a fire's TargetsPerFire may go to
// held rows that are due (retries and redrives after a release); the rest
// stay with the outbox scan, so held targets cannot starve the healthy
// ones and the healthy ones cannot starve a redrive.
func redriveShare(b RelayBudget) int { return max(1, b.TargetsPerFire/2) }

// dueMarker is a retry marker whose time has come.
type dueMarker struct {
	key    string
	target Partition
}

// dueMarkers reads up to redriveShare retry markers that are due, noting
// whether more are due (dueLeft) and when the next one is (nextDue).
func (f *fireRun) dueMarkers() ([]dueMarker, error) {
	share := redriveShare(f.b)
	var out []dueMarker
	after := ""
	for {
		pg, err := f.h.Source.Scan(f.ctx, f.source, ScanRequest{Start: layout.RetryPrefix, End: layout.RetryEnd, After: after, Limit: share + 1})
		if err != nil {
			return nil, fmt.Errorf("fire %s: scan retry markers: %w", f.source, err)
		}
		for _, it := range pg.Items {
			due, t, err := parseRetryKey(it.Key)
			if err != nil {
				return nil, fmt.Errorf("fire %s: %w", f.source, err)
			}
			if due > f.now {
				f.nextDue = due
				return out, nil
			}
			if len(out) >= share {
				f.dueLeft = true
				return out, nil
			}
			out = append(out, dueMarker{key: it.Key, target: t})
		}
		if pg.Next == "" {
			return out, nil
		}
		after = pg.Next
	}
}

// collectDue reads, for the due markers, the target's held pages in seq
// order, within rowsLeft rows and the checkpoint's room. A marker that
// disagrees with its target's record (a crash cannot leave one: both
// change in one batch) is deleted by the checkpoint.
func (f *fireRun) collectDue(markers []dueMarker, rowsLeft int) error {
	targets := make([]Partition, len(markers))
	for i, m := range markers {
		targets[i] = m.target
	}
	if err := f.prefetch(targets); err != nil {
		return err
	}
	for _, m := range markers {
		if rowsLeft <= 0 {
			f.dueLeft = true
			return nil
		}
		slot, err := f.rec(m.target)
		if err != nil {
			return err
		}
		if slot.marker != "" {
			continue // a second marker for one target: only the first is served
		}
		slot.marker = m.key
		if slot.rec.State != StateActive || slot.rec.Held == 0 || retryKey(slot.rec.RetryMS, m.target) != m.key {
			if !f.reserve(slot, 1, f.caps.ItemSize(f.source, m.key, 0)) {
				f.dueLeft = true
				return nil
			}
			continue // stale: the checkpoint deletes it
		}
		tw, err := f.collectHeld(slot, rowsLeft)
		if err != nil {
			return err
		}
		if tw == nil {
			f.dueLeft = true // no room left in the checkpoint
			return nil
		}
		rowsLeft -= len(tw.rows)
		f.redrive = append(f.redrive, tw)
	}
	return nil
}

// collectHeld reads slot's held pages in seq order, up to rowsLeft rows
// and the checkpoint's room. nil: not even the first page fits.
func (f *fireRun) collectHeld(slot *recSlot, rowsLeft int) (*targetWork, error) {
	t := slot.rec.Target
	tw := &targetWork{target: t, held: true}
	prefix := heldPrefix(t)
	after := ""
	for {
		pg, err := f.h.Source.Scan(f.ctx, f.source, ScanRequest{Start: prefix, End: prefixEnd(prefix), After: after, Limit: 4})
		if err != nil {
			return nil, fmt.Errorf("fire %s: scan held rows of %q: %w", f.source, t, err)
		}
		for _, it := range pg.Items {
			page, err := decodePage(it.Key, it.Value)
			if err != nil {
				return nil, fmt.Errorf("fire %s: %w", f.source, err)
			}
			if page.Target != t || (len(tw.pages) > 0 && page.First <= tw.pages[len(tw.pages)-1].Last()) {
				return nil, fmt.Errorf("fire %s: %w: held page %s of target %q holds target %q seqs %d..%d",
					f.source, ErrCorruptRecord, it.Key, t, page.Target, page.First, page.Last())
			}
			items, size := 1, f.caps.ItemSize(f.source, it.Key, max(len(it.Value), pageRewriteBound(page)))
			if len(tw.pages) == 0 {
				mi, mb := f.markerRoom(t)
				items, size = items+mi, size+mb
			}
			n := min(len(page.Rows), rowsLeft)
			if n == 0 || !f.reserve(slot, items, size) {
				if len(tw.pages) == 0 {
					return nil, nil
				}
				tw.heldNext, tw.heldNextMS = page.First, page.CommitMS
				return tw, nil
			}
			if cost := heldGoneCost(it.Key); f.loose && f.goneRoom >= cost {
				// Finished, it leaves through rs.gone_held (gone.go).
				f.goneRoom -= cost
				if tw.looseHeld == nil {
					tw.looseHeld = map[string]bool{}
				}
				tw.looseHeld[it.Key] = true
			}
			pageCopy := page
			tw.pages = append(tw.pages, &pageCopy)
			tw.rows = append(tw.rows, page.Rows[:n]...)
			rowsLeft -= n
			if n < len(page.Rows) {
				return tw, nil
			}
		}
		if pg.Next == "" {
			if len(tw.pages) == 0 {
				// None left (a fire that took the claim over delivered them
				// after this one read the record): the checkpoint still
				// rewrites the record's marker, delete and put, as for a
				// first page.
				if mi, mb := f.markerRoom(t); !f.reserve(slot, mi, mb) {
					return nil, nil
				}
			}
			return tw, nil
		}
		after = pg.Next
	}
}

// prefixEnd is the first key after every key starting with prefix, for a
// prefix ending in "/" ('0' follows '/').
func prefixEnd(prefix string) string { return prefix[:len(prefix)-1] + "0" }

// remainingHeld reports the first held row the checkpoint keeps for tw's
// target: the rest of a partly delivered page, or else the first page it
// did not collect; ok false when none is left.
func (tw *targetWork) remainingHeld() (first uint64, ms int64, ok bool) {
	for _, pg := range tw.pages {
		i, _ := slices.BinarySearchFunc(pg.Rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
		if i < len(pg.Rows) {
			return pg.Rows[i].Seq, pg.CommitMS, true
		}
	}
	if tw.heldNext > 0 {
		return tw.heldNext, tw.heldNextMS, true
	}
	return 0, 0, false
}
