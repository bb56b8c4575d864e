package relaycore

import (
	"fmt"
	"slices"
)

// collect selects the fire's work: held rows that are due and the outbox
// scan. When both have work they share the fire fairly: they take turns
// going first (rs.HeldFirst says who went first last time), and the first
// may take at most half of the rows and of the checkpoint's room (but
// always its first page) and redriveShare targets, the other the rest. Without the split, redrives whose pages
// fill the checkpoint could starve the healthy targets behind them, and a
// busy outbox could starve a redrive.
func (f *fireRun) collect() error {
	markers := f.markers // read with the claim (fireRun.claim)
	if len(markers) == 0 {
		return f.scan(f.b.TargetsPerFire, f.b.RowsPerFire)
	}
	half := func() {
		f.capItems, f.capBytes = f.itemsRoom-f.itemsRoom/2, f.bytesRoom-f.bytesRoom/2
		f.usedItems, f.usedBytes = 0, 0
	}
	uncap := func() { f.capItems, f.capBytes = 0, 0 }
	// Alternate who goes first (rs remembers who did last time).
	f.heldFirst, f.turnTaken = !f.cur.HeldFirst, true
	if f.heldFirst {
		half()
		if err := f.collectDue(markers, f.b.RowsPerFire/2+f.b.RowsPerFire%2); err != nil {
			return err
		}
		uncap()
		rows := f.b.RowsPerFire
		for _, tw := range f.redrive {
			rows -= len(tw.rows)
		}
		return f.scan(f.b.TargetsPerFire-len(f.redrive), rows)
	}
	half()
	if err := f.scan(max(1, f.b.TargetsPerFire-len(markers)), f.b.RowsPerFire/2+f.b.RowsPerFire%2); err != nil {
		return err
	}
	uncap()
	rows := f.b.RowsPerFire
	for _, tw := range f.sel {
		rows -= len(tw.rows)
	}
	if n := f.b.TargetsPerFire - len(f.sel); n < len(markers) {
		if n <= 0 {
			f.dueLeft = true
			return nil
		}
		markers, f.dueLeft = markers[:n], true
	}
	return f.collectDue(markers, rows)
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
	f.cur.overlayDone(&r)
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
		f.cur.overlayDone(&r)
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
