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
	for _, p := range pairs {
		if err := checkIDs(p.SegmentID, p.PeerID); err != nil {
			return nil, fmt.Errorf("ClaimBatch: %w", err)
		}
	}
	var out []Record
	err := l.update(func(b buckets) error {
		out = out[:0]
		for _, p := range pairs {
			r, ok, err := b.get(p.SegmentID, p.PeerID)
			if err != nil {
				return err
			}
			if !ok || !(r.State == StateScheduled || r.State == StateFailed && !r.NextAttemptAfter.After(now)) {
				continue
			}
			n := r
			n.State, n.Attempts, n.NextAttemptAfter, n.UpdatedAt = StateInflight, r.Attempts+1, time.Time{}, now
			if err := b.put(&r, n); err != nil {
				return err
			}
			out = append(out, n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ClaimBatch: %w", err)
	}
	return out, nil
}

// AckBatch records the peer's ACK for every pair, Inflight → Acked as
// TransitionAcked, in one transaction. If any pair is not Inflight (or
// missing) nothing changes and the error is that pair's
// *TransitionError (or ErrNotFound): the caller then records them one by
// one. Not idempotent, like TransitionAcked: a retry after success fails
// with *TransitionError from Acked.
func (l *Ledger) AckBatch(pairs []Pair, now time.Time) ([]Record, error) {
	const op = "AckBatch"
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
				return err
			}
			if !ok {
				return fmt.Errorf("%s %s/%s: %w", op, p.SegmentID, p.PeerID, ErrNotFound)
			}
			if r.State != StateInflight {
				return &TransitionError{Op: op, SegmentID: p.SegmentID, PeerID: p.PeerID, From: r.State}
			}
			n := r
			n.State, n.LastError, n.UpdatedAt = StateAcked, "", now
			if err := b.put(&r, n); err != nil {
				return err
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
