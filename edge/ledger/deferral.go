package ledger

import (
	"fmt"
	"time"
)

// Pair names one record.
type Pair struct {
	SegmentID string
	PeerID    string
}

// Defer postpones due records without counting an attempt: every named
// record that is Scheduled or Failed and whose NextAttemptAfter is before
// until gets NextAttemptAfter = until (and UpdatedAt = now); its state,
// Attempts, BudgetBase and LastError are kept. It never brings a record
// forward. Records that are absent, in another state, or already due at
// or after until are left alone: they changed since the caller's scan,
// and the caller's decision no longer applies. It returns the records it
// moved, in the order given. One transaction; idempotent, so a retry after any error is safe.
//
// The relay uses it for a peer whose dial circuit is open: work owed to an
// unreachable peer waits for the circuit to half-open instead of costing a
// dial timeout and an attempt each.
func (l *Ledger) Defer(until, now time.Time, pairs ...Pair) ([]Pair, error) {
	for _, p := range pairs {
		if err := checkIDs(p.SegmentID, p.PeerID); err != nil {
			return nil, fmt.Errorf("Defer: %w", err)
		}
	}
	var moved []Pair
	err := l.update(func(b buckets) error {
		moved = moved[:0]
		for _, p := range pairs {
			r, ok, err := b.get(p.SegmentID, p.PeerID)
			if err != nil {
				return err
			}
			if !ok || !r.State.pending() || !r.NextAttemptAfter.Before(until) {
				continue
			}
			nr := r
			nr.NextAttemptAfter, nr.UpdatedAt = until, now
			if err := b.put(&r, nr); err != nil {
				return err
			}
			moved = append(moved, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("Defer: %w", err)
	}
	return moved, nil
}
