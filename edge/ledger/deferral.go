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
// Attempts, BudgetBase and LastError are kept, and DeferredFrom remembers
// the NextAttemptAfter it had before its first deferral (ReleaseDeferred
// restores it at the next start). It never brings a record
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
			if nr.DeferredFrom.IsZero() {
				nr.DeferredFrom = r.NextAttemptAfter
			}
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
// after now due at now (UpdatedAt = now, and its deferral, if any, ends),
// keeping its state, Attempts, BudgetBase and LastError, and returns how
// many it moved. One read transaction over the pending index, and a write
// transaction only when some record is to move.
//
// The relay calls it when a dial to the peer succeeds after its dial
// circuit was open, and after its first successful dial to the peer: the
// records deferred or backed off while the peer was unreachable would
// otherwise come due at scattered times (each failed attempt's back-off,
// the probe's dial deadline), so the summary exchange (QUERY/HOLDS) would
// see them a few at a time and they would be offered one by one. Together
// they are summarised in a handful of round trips. A record backed off for
// another reason (a NACK) is retried at once too: the peer just came back,
// which is when a retry is most likely to help.
func (l *Ledger) Expedite(peerID string, now time.Time) (int, error) {
	if err := checkIDs("x", peerID); err != nil {
		return 0, fmt.Errorf("Expedite: %w", err)
	}
	var late []Pair
	err := l.view(func(b buckets) error {
		var err error
		late, err = b.dueAfter(peerID, now)
		return err
	})
	if err != nil || len(late) == 0 {
		if err != nil {
			return 0, fmt.Errorf("Expedite: %w", err)
		}
		return 0, nil
	}
	err = l.update(func(b buckets) error {
		late, err = b.dueAfter(peerID, now)
		if err != nil {
			return err
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
			nr.NextAttemptAfter, nr.DeferredFrom, nr.UpdatedAt = now, time.Time{}, now
			if err := b.put(&r, nr); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("Expedite: %w", err)
	}
	return len(late), nil
}

// dueAfter returns peerID's pending records due after now, in pending
// order.
func (b buckets) dueAfter(peerID string, now time.Time) ([]Pair, error) {
	var late []Pair
	c := b.pending.Cursor()
	for k, _ := c.Seek(pendKey(now.Add(time.Nanosecond), "", "")); k != nil; k, _ = c.Next() {
		seg, peer, ok := splitKey(k[8:])
		if !ok {
			return nil, fmt.Errorf("malformed pending key %q", k)
		}
		if peer == peerID {
			late = append(late, Pair{SegmentID: seg, PeerID: peer})
		}
	}
	return late, nil
}

// Postpone records an attempt the peer refused for want of room (a NACK
// quota): Inflight → Failed, due at until, with cause as LastError, and
// the attempt not charged to the retry budget (BudgetBase moves up with
// Attempts, so BudgetUsed is what it was before the claim). It never
// deadletters. A refusal for room says the peer is full, not that the
// segment cannot be delivered: charging it let a receiver's full disk
// deadletter every record owed to it after max_retries rounds (about 13
// minutes at the default back-off). The caller bounds how often a full
// peer is asked (the relay's room circuit).
func (l *Ledger) Postpone(segmentID, peerID string, cause error, until, now time.Time) (Record, error) {
	const op = "Postpone"
	return l.transition(op, segmentID, peerID, func(r Record) (Record, error) {
		if r.State != StateInflight {
			return r, &TransitionError{Op: op, SegmentID: segmentID, PeerID: peerID, From: r.State}
		}
		r.State, r.BudgetBase, r.NextAttemptAfter = StateFailed, r.BudgetBase+1, until
		r.LastError, r.UpdatedAt = truncate(errText(cause)), now
		return r, nil
	})
}
