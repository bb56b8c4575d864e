package ledger

import (
	"fmt"
	"time"
)

// Batch transitions for a sender that pipelines: claiming a window of
// records, or recording a window of ACKs, one record at a time costs a
// bbolt commit (two fsyncs) each, more than the delivery itself. These do
// the same transitions as TryTransitionInflight and TransitionAcked, with
// the same rules per record, in one transaction.

// ClaimBatch claims every pair that TryTransitionInflight would claim
// (Scheduled, or Failed and due at now) and skips the others (Inflight,
// Failed not yet due, terminal, or missing), all in one transaction. It
// returns the claimed records in the order given. Safe to retry: a pair
// claimed by an earlier call is Inflight and skipped.
func (l *Ledger) ClaimBatch(pairs []Pair, now time.Time) ([]Record, error) {
	return l.batch("ClaimBatch", pairs, func(_ Pair, r Record, ok bool) (Record, bool, error) {
		if !ok || !(r.State == StateScheduled || r.State == StateFailed && !r.NextAttemptAfter.After(now)) {
			return r, false, nil
		}
		r.State, r.Attempts, r.NextAttemptAfter, r.DeferredFrom, r.UpdatedAt = StateInflight, r.Attempts+1, time.Time{}, time.Time{}, now
		return r, true, nil
	})
}

// AckBatch records the peer's ACK for every pair, Inflight → Acked as
// TransitionAcked, in one transaction. If any pair is not Inflight (or
// missing) nothing changes and the error is that pair's
// *TransitionError (or ErrNotFound): the caller then records them one by
// one. Not idempotent, like TransitionAcked: a retry after success fails
// with *TransitionError from Acked.
func (l *Ledger) AckBatch(pairs []Pair, now time.Time) ([]Record, error) {
	const op = "AckBatch"
	return l.batch(op, pairs, func(p Pair, r Record, ok bool) (Record, bool, error) {
		if !ok {
			return r, false, fmt.Errorf("%s %s/%s: %w", op, p.SegmentID, p.PeerID, ErrNotFound)
		}
		if r.State != StateInflight {
			return r, false, &TransitionError{Op: op, SegmentID: p.SegmentID, PeerID: p.PeerID, From: r.State}
		}
		r.State, r.LastError, r.UpdatedAt = StateAcked, "", now
		return r, true, nil
	})
}

// batch checks every pair's ids, then in one transaction gives each
// pair's record (ok: it exists) to step, which returns the record to put
// (write) or skips it; an error from step rolls the whole batch back and
// is returned as it is (other errors are prefixed with op). It returns the
// records written, in the order given.
func (l *Ledger) batch(op string, pairs []Pair, step func(p Pair, r Record, ok bool) (next Record, write bool, err error)) ([]Record, error) {
	for _, p := range pairs {
		if err := checkIDs(p.SegmentID, p.PeerID); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	var out []Record
	err := l.update(func(b buckets) error {
		out = out[:0]
		for _, p := range pairs {
			r, ok, err := b.get(p.SegmentID, p.PeerID)
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			n, write, err := step(p, r, ok)
			if err != nil {
				return err
			}
			if !write {
				continue
			}
			if err := b.put(&r, n); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			out = append(out, n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
