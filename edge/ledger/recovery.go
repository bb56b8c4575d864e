package ledger

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Start-up reconciliation. Run after opening the ledger and the segment
// store and before starting workers, in the order Recover uses:
// InflightToFailed, PruneMissing, RescheduleReady. Each is one
// transaction (PruneMissing: one read, then one write), idempotent, and
// safe to run again after an error or at any later time.

// InflightToFailed turns attempts abandoned by a stop or crash (Inflight
// records, which no worker of this process owns yet) into failed attempts
// under policy p: Failed with back-off, or Deadletter when the budget is
// spent. It returns the number of records moved.
func (l *Ledger) InflightToFailed(now time.Time, p Policy) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, fmt.Errorf("InflightToFailed: %w", err)
	}
	return l.bulk("InflightToFailed", func(r Record) (Record, bool) {
		if r.State != StateInflight {
			return r, false
		}
		return failed(r, "attempt abandoned: agent stopped while in flight", now, p), true
	})
}

// PruneMissing force-deadletters non-terminal records (Scheduled,
// Inflight, Failed) whose segment is no longer stored, as reported by
// exists. exists is called outside any ledger transaction, once per
// segment, so it may itself read the shared database. A record that
// changed state between the check and the write is left alone.
func (l *Ledger) PruneMissing(exists func(segmentID string) bool, now time.Time) (int, error) {
	// Records come in key order, so segs is sorted and exists is called
	// in a reproducible order.
	var segs []string
	err := l.each(func(r Record) error {
		if !r.State.Terminal() && (len(segs) == 0 || segs[len(segs)-1] != r.SegmentID) {
			segs = append(segs, r.SegmentID)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("PruneMissing: %w", err)
	}
	gone := map[string]bool{}
	for _, seg := range segs {
		if !exists(seg) {
			gone[seg] = true
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	return l.bulk("PruneMissing", func(r Record) (Record, bool) {
		if r.State.Terminal() || !gone[r.SegmentID] {
			return r, false
		}
		r.State, r.NextAttemptAfter, r.UpdatedAt = StateDeadletter, time.Time{}, now
		r.LastError = "segment missing from local store"
		return r, true
	})
}

// RescheduleReady moves Failed records whose NextAttemptAfter ≤ now back
// to Scheduled (keeping NextAttemptAfter, so pending order is unchanged).
func (l *Ledger) RescheduleReady(now time.Time) (int, error) {
	return l.bulk("RescheduleReady", func(r Record) (Record, bool) {
		if r.State != StateFailed || r.NextAttemptAfter.After(now) {
			return r, false
		}
		r.State, r.UpdatedAt = StateScheduled, now
		return r, true
	})
}

// RecoveryReport counts what Recover changed.
type RecoveryReport struct {
	AbandonedInflight int // InflightToFailed
	PrunedMissing     int // PruneMissing
	Rescheduled       int // RescheduleReady
}

// Recover runs the three reconciliation steps in order.
func (l *Ledger) Recover(now time.Time, p Policy, exists func(segmentID string) bool) (RecoveryReport, error) {
	var rep RecoveryReport
	var err error
	if rep.AbandonedInflight, err = l.InflightToFailed(now, p); err != nil {
		return rep, err
	}
	if rep.PrunedMissing, err = l.PruneMissing(exists, now); err != nil {
		return rep, err
	}
	rep.Rescheduled, err = l.RescheduleReady(now)
	return rep, err
}

// bulk rewrites, in one transaction, every record for which step returns
// true, and returns how many it rewrote.
func (l *Ledger) bulk(op string, step func(Record) (Record, bool)) (int, error) {
	n := 0
	err := l.update(func(b buckets) error {
		type change struct{ old, new Record }
		var changes []change
		err := b.records.ForEach(func(k, v []byte) error {
			r, err := decode(k, v)
			if err != nil {
				return err
			}
			if nr, ok := step(r); ok {
				changes = append(changes, change{r, nr})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, c := range changes {
			if err := b.put(&c.old, c.new); err != nil {
				return err
			}
		}
		n = len(changes)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}

// CheckRecords decodes every record in tx and checks that the pending
// index holds exactly the Scheduled and Failed records under their
// NextAttemptAfter, for the daemon's start-up check of the database. A
// ledger that does not exist yet is fine (Open creates it).
func CheckRecords(tx *bolt.Tx) error {
	root := tx.Bucket(rootBucket)
	if root == nil {
		return nil
	}
	b := buckets{records: root.Bucket(recordsBucket), pending: root.Bucket(pendingBucket)}
	if b.records == nil || b.pending == nil {
		return errors.New("ledger: records or pending bucket missing")
	}
	want := 0
	err := b.records.ForEach(func(k, v []byte) error {
		r, err := decode(k, v)
		if err != nil {
			return err
		}
		if r.State < StateScheduled || r.State > StateDeadletter {
			return fmt.Errorf("ledger record %s/%s: unknown state %d", r.SegmentID, r.PeerID, r.State)
		}
		if r.State.pending() {
			want++
			if b.pending.Get(pendKey(r.NextAttemptAfter, r.SegmentID, r.PeerID)) == nil {
				return fmt.Errorf("ledger record %s/%s is %s but not in the pending index", r.SegmentID, r.PeerID, r.State)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n := b.pending.Stats().KeyN; n != want {
		return fmt.Errorf("ledger pending index holds %d keys for %d pending records", n, want)
	}
	return nil
}
