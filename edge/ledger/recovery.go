package ledger

import (
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Start-up reconciliation. Run after opening the ledger and the segment
// store and before starting workers, in the order Recover uses:
// InflightToFailed, PruneMissing, ReleaseDeferred, RescheduleReady. Each
// reads the records in one transaction and, only when it has something to
// change, rewrites them in one write transaction (so a start with nothing
// to repair commits nothing); each is idempotent and safe to run again
// after an error or at any later time.

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
	return l.PruneMissingAll(func(segs []string) ([]bool, error) {
		held := make([]bool, len(segs))
		for i, seg := range segs {
			held[i] = exists(seg)
		}
		return held, nil
	}, now)
}

// Held reports which of segmentIDs (ascending, at most HeldBatch) are
// stored: held[i] for segmentIDs[i]. It is asked for many segments at once
// so that one read of the segment index answers them all: start-up asks
// it for every segment with work pending, 10,000 after a crash with a
// backlog or a restart soon after a peer was added, and a read
// transaction each cost more than the answer.
type Held func(segmentIDs []string) (held []bool, err error)

// HeldBatch is the most segment ids PruneMissingAll passes to Held at once.
const HeldBatch = 1024

// PruneMissingAll is PruneMissing asking held for the segments, HeldBatch
// at a time, in ascending order, outside any ledger transaction (held may
// read the shared database). An error from held stops it before anything
// is deadlettered.
func (l *Ledger) PruneMissingAll(held Held, now time.Time) (int, error) {
	w, err := l.survey(now)
	if err != nil {
		return 0, fmt.Errorf("PruneMissing: %w", err)
	}
	return l.pruneMissing(held, w.live, now)
}

// pruneMissing is PruneMissingAll for the segments segs (ascending) with
// a non-terminal record.
func (l *Ledger) pruneMissing(held Held, segs []string, now time.Time) (int, error) {
	gone := map[string]bool{}
	for page := range slices.Chunk(segs, HeldBatch) {
		ok, err := held(page)
		if err != nil {
			return 0, fmt.Errorf("PruneMissing: %w", err)
		}
		if len(ok) != len(page) {
			return 0, fmt.Errorf("PruneMissing: held answered %d of %d segments", len(ok), len(page))
		}
		for i, seg := range page {
			if !ok[i] {
				gone[seg] = true
			}
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	return l.bulk("PruneMissing", func(r Record) (Record, bool) {
		if r.State.Terminal() || !gone[r.SegmentID] {
			return r, false
		}
		r.State, r.NextAttemptAfter, r.DeferredFrom, r.UpdatedAt = StateDeadletter, time.Time{}, time.Time{}, now
		r.LastError = "segment missing from local store"
		return r, true
	})
}

// ReleaseDeferred ends every deferral (Defer) that is still standing:
// each pending record with a DeferredFrom gets back the NextAttemptAfter
// it had before it was deferred (UpdatedAt = now), keeping its state,
// Attempts, BudgetBase and LastError. It returns the number of records
// moved.
//
// A deferral is the verdict of a dial circuit, which lives in the memory
// of the process that opened it: a new process starts with every circuit
// closed and learns afresh whether a peer is reachable. Without this a
// restart waited out the previous process's circuit (up to backoff.max,
// 5 min by default) even when the peer answered at once. The records
// were due when they were deferred, so they are due again now, in their
// original order, and a peer still down opens its new circuit with one
// dial round.
func (l *Ledger) ReleaseDeferred(now time.Time) (int, error) {
	return l.bulk("ReleaseDeferred", func(r Record) (Record, bool) {
		if !r.State.pending() || r.DeferredFrom.IsZero() {
			return r, false
		}
		r.NextAttemptAfter, r.DeferredFrom, r.UpdatedAt = r.DeferredFrom, time.Time{}, now
		return r, true
	})
}

// RescheduleReady moves Failed records whose NextAttemptAfter ≤ now back
// to Scheduled (keeping NextAttemptAfter, so pending order is unchanged;
// a deferral that has run out ends).
func (l *Ledger) RescheduleReady(now time.Time) (int, error) {
	return l.bulk("RescheduleReady", func(r Record) (Record, bool) {
		if r.State != StateFailed || r.NextAttemptAfter.After(now) {
			return r, false
		}
		r.State, r.DeferredFrom, r.UpdatedAt = StateScheduled, time.Time{}, now
		return r, true
	})
}

// RecoveryReport counts what Recover changed.
type RecoveryReport struct {
	AbandonedInflight int // InflightToFailed
	PrunedMissing     int // PruneMissing
	Undeferred        int // ReleaseDeferred
	Rescheduled       int // RescheduleReady
}

// Recover runs the four reconciliation steps in order; held answers
// PruneMissingAll. One read of the records (survey) tells which steps
// have work, and only those run: a start after a clean stop usually has
// none, and four scans of 10,000 records each, decoded anew, were a fifth
// of a plain restart's CPU time and garbage. A step that has work makes
// its own scans as before; an abandoned attempt (InflightToFailed) can
// change what the later steps find, so the records are read again after
// it.
func (l *Ledger) Recover(now time.Time, p Policy, held Held) (RecoveryReport, error) {
	var rep RecoveryReport
	if err := p.Validate(); err != nil {
		return rep, fmt.Errorf("InflightToFailed: %w", err)
	}
	w, err := l.survey(now)
	if err != nil {
		return rep, fmt.Errorf("Recover: %w", err)
	}
	if w.inflight {
		if rep.AbandonedInflight, err = l.InflightToFailed(now, p); err != nil {
			return rep, err
		}
		if w, err = l.survey(now); err != nil {
			return rep, fmt.Errorf("Recover: %w", err)
		}
	}
	if rep.PrunedMissing, err = l.pruneMissing(held, w.live, now); err != nil {
		return rep, err
	}
	// Deadlettering (PruneMissing) only takes work away from the two
	// steps left, so what the survey found still bounds it; a deferral
	// released can make a failure due, so RescheduleReady runs after any.
	if w.deferred {
		if rep.Undeferred, err = l.ReleaseDeferred(now); err != nil {
			return rep, err
		}
	}
	if w.deferred || w.ready {
		rep.Rescheduled, err = l.RescheduleReady(now)
	}
	return rep, err
}

// recoveryWork is what survey found for Recover's steps.
type recoveryWork struct {
	inflight bool     // an Inflight record (InflightToFailed)
	live     []string // the segments with a non-terminal record, ascending (PruneMissing)
	deferred bool     // a pending record with a deferral (ReleaseDeferred)
	ready    bool     // a Failed record due by now (RescheduleReady)
}

// survey reads every record once for Recover.
func (l *Ledger) survey(now time.Time) (recoveryWork, error) {
	var w recoveryWork
	// Records come in key order, so live is sorted and held is asked in
	// a reproducible order.
	err := l.each(func(r Record) error {
		if r.State.Terminal() {
			return nil
		}
		if n := len(w.live); n == 0 || w.live[n-1] != r.SegmentID {
			w.live = append(w.live, r.SegmentID)
		}
		w.inflight = w.inflight || r.State == StateInflight
		w.deferred = w.deferred || r.State.pending() && !r.DeferredFrom.IsZero()
		w.ready = w.ready || r.State == StateFailed && !r.NextAttemptAfter.After(now)
		return nil
	})
	return w, err
}

// errStop ends a read-only scan early.
var errStop = errors.New("stop scan")

// bulk rewrites, in one transaction, every record for which step returns
// true, and returns how many it rewrote. A read transaction looks first:
// when step selects nothing (the usual start) no write transaction is
// committed, which would cost two fsyncs for nothing.
func (l *Ledger) bulk(op string, step func(Record) (Record, bool)) (int, error) {
	err := l.each(func(r Record) error {
		if _, ok := step(r); ok {
			return errStop
		}
		return nil
	})
	if err == nil {
		return 0, nil
	}
	if !errors.Is(err, errStop) {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	n := 0
	err = l.update(func(b buckets) error {
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
		if r.State < StateScheduled || r.State > StateCancelled {
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
