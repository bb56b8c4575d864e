package ledger

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// RemoveSettled deletes the records of segments that are settled and gone:
// every record of the segment is Acked or Cancelled with UpdatedAt ≤
// cutoff, and
// stored, asked inside the same transaction, says the segment is not held
// locally. It returns the number of segments and records removed. One
// write transaction, and none when nothing is to go; idempotent.
//
// Why each condition:
//   - all Acked or Cancelled (delivery ended on purpose: a takedown):
//     a Deadletter record is the operator's only trace of a
//     delivery that never happened; it goes when the operator purges it
//     (Purge), never silently. Scheduled, Inflight and Failed are work.
//   - not stored, checked in this transaction (stored must read the
//     segment index of the shared database through tx): removing the
//     records of a segment that is still held would make the next
//     EnsureScheduled (start-up reconciliation) owe it to every peer again.
//   - UpdatedAt ≤ cutoff (now − retention): the records are the memory that
//     stops a segment coming back (a late resend by another peer) from
//     being relayed again to peers that already acknowledged it; in a mesh
//     of evicting forwarders that memory is what ends the echo.
func (l *Ledger) RemoveSettled(cutoff time.Time, stored func(tx *bolt.Tx, segmentID string) bool) (segments, records int, err error) {
	// A read transaction looks first: at most starts and retention passes
	// nothing is due, and a write transaction would commit (two fsyncs)
	// for nothing.
	var doomed []Record
	err = l.db.View(func(tx *bolt.Tx) error {
		doomed, _, err = settledGone(tx, cutoff, stored)
		return err
	})
	if err != nil || len(doomed) == 0 {
		if err != nil {
			return 0, 0, fmt.Errorf("RemoveSettled: %w", err)
		}
		return 0, 0, nil
	}
	err = l.db.Update(func(tx *bolt.Tx) error {
		doomed, segments, err = settledGone(tx, cutoff, stored)
		if err != nil {
			return err
		}
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		for _, r := range doomed {
			if err := b.delete(r); err != nil {
				return err
			}
		}
		records = len(doomed)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("RemoveSettled: %w", err)
	}
	return segments, records, nil
}

// settledGone returns the records RemoveSettled removes, as seen by tx,
// and the number of segments they belong to. The records of a segment
// still stored are stepped over undecoded: nothing of theirs is removed,
// and they are nearly all of them (decoding 20,000 records at every
// start, for nothing, was a tenth of a start-up's CPU time).
func settledGone(tx *bolt.Tx, cutoff time.Time, stored func(tx *bolt.Tx, segmentID string) bool) (doomed []Record, segments int, err error) {
	b, err := bucketsOf(tx)
	if err != nil {
		return nil, 0, err
	}
	// Keys are segment 0x00 peer and ids hold no NUL, so a segment's
	// records are adjacent in key order.
	c := b.records.Cursor()
	for k, v := c.First(); k != nil; {
		seg, _, ok := splitKey(k)
		if !ok {
			return nil, 0, fmt.Errorf("decode ledger record: malformed key %q", k)
		}
		prefix := recKey(seg, "")
		if stored(tx, seg) {
			k, v = skipPrefix(c, prefix)
			continue
		}
		var group []Record
		settled := true
		for ; k != nil && hasPrefix(k, prefix); k, v = c.Next() {
			r, err := decode(k, v)
			if err != nil {
				return nil, 0, err
			}
			group = append(group, r)
			if r.State != StateAcked && r.State != StateCancelled || r.UpdatedAt.After(cutoff) {
				settled = false
			}
		}
		if settled {
			doomed = append(doomed, group...)
			segments++
		}
	}
	return doomed, segments, nil
}

// skipPrefix moves c past the current key and the keys after it that
// start with prefix, and returns the first key and value that does not.
func skipPrefix(c *bolt.Cursor, prefix []byte) (k, v []byte) {
	k, v = c.Next()
	for k != nil && hasPrefix(k, prefix) {
		k, v = c.Next()
	}
	return k, v
}
