package ledger

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Cancel ends delivery of segmentID to peerID on purpose, for the attempt
// in flight: Inflight → Cancelled, cause as LastError. It is the sender's
// answer to a peer that took the segment down and refuses it for good
// (NACK evicted): the record is neither retried nor deadlettered, since
// nothing failed and no operator has anything to repair. A record in
// another state is a *TransitionError, an absent one ErrNotFound.
func (l *Ledger) Cancel(segmentID, peerID string, cause error, now time.Time) (Record, error) {
	const op = "Cancel"
	return l.transition(op, segmentID, peerID, func(r Record) (Record, error) {
		if r.State != StateInflight {
			return r, &TransitionError{Op: op, SegmentID: segmentID, PeerID: peerID, From: r.State}
		}
		return cancelled(r, errText(cause), now), nil
	})
}

// CancelSegmentIn cancels, inside tx (a write transaction on the ledger's
// database), every record of segmentID that is not Acked or Cancelled
// already: Scheduled, Inflight, Failed and Deadletter → Cancelled, why as
// LastError. It is the takedown's step in the transaction that evicts the
// segment (segstore.Store.Takedown), so a crash leaves either the segment
// with its records or neither. Acked records stay: they say which peers
// were given the segment. An Inflight record's attempt then finds its
// record cancelled and records nothing (the relay executor logs it). It
// returns the number of records cancelled.
func (l *Ledger) CancelSegmentIn(tx *bolt.Tx, segmentID, why string, now time.Time) (int, error) {
	b, err := bucketsOf(tx)
	if err != nil {
		return 0, fmt.Errorf("CancelSegment %s: %w", segmentID, err)
	}
	recs, err := listSegment(b, segmentID)
	if err != nil {
		return 0, fmt.Errorf("CancelSegment %s: %w", segmentID, err)
	}
	n := 0
	for _, r := range recs {
		if r.State == StateAcked || r.State == StateCancelled {
			continue
		}
		if err := b.put(&r, cancelled(r, why, now)); err != nil {
			return n, fmt.Errorf("CancelSegment %s: %w", segmentID, err)
		}
		n++
	}
	return n, nil
}

func cancelled(r Record, why string, now time.Time) Record {
	r.State, r.NextAttemptAfter, r.DeferredFrom, r.LastError, r.UpdatedAt = StateCancelled, time.Time{}, time.Time{}, truncate(why), now
	return r
}
