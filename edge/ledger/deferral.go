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

// Expedite makes every Scheduled or Failed record of peerID that is due
// after now due at now (UpdatedAt = now), keeping its state, Attempts,
// BudgetBase and LastError, and returns how many it moved. One
// transaction over the pending index.
//
// The relay calls it when a dial to the peer succeeds after its dial
// circuit was open: the records deferred or backed off while the peer was
// unreachable would otherwise come due at scattered times (each failed
// attempt's back-off, the probe's dial deadline), so the summary exchange
// (QUERY/HOLDS) would see them a few at a time and they would be offered
// one by one. Together they are summarised in a handful of round trips.
// A record backed off for another reason (a NACK) is retried at once too:
// the peer just came back, which is when a retry is most likely to help.
func (l *Ledger) Expedite(peerID string, now time.Time) (int, error) {
	if err := checkIDs("x", peerID); err != nil {
		return 0, fmt.Errorf("Expedite: %w", err)
	}
	n := 0
	err := l.update(func(b buckets) error {
		n = 0
		var late []Pair
		c := b.pending.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if !pendTime(k).After(now) {
				continue
			}
			seg, peer, ok := splitKey(k[8:])
			if !ok {
				return fmt.Errorf("malformed pending key %q", k)
			}
			if peer == peerID {
				late = append(late, Pair{SegmentID: seg, PeerID: peer})
			}
		}
		for _, p := range late {
			r, ok, err := b.get(p.SegmentID, p.PeerID)
			if err != nil {
				return err
			}
			if !ok || !r.State.pending() {
				return fmt.Errorf("pending index names %s/%s but no pending record exists", p.SegmentID, p.PeerID)
			}
			nr := r
			nr.NextAttemptAfter, nr.UpdatedAt = now, now
			if err := b.put(&r, nr); err != nil {
				return err
			}
		}
		n = len(late)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("Expedite: %w", err)
	}
	return n, nil
}
