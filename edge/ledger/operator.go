package ledger

import (
	"fmt"
	"time"
)

// RetryDeadletter is the operator's recovery: Deadletter → Scheduled, due
// at now, with a fresh retry budget (BudgetBase = Attempts; Attempts is
// kept, so it stays monotonic). An empty segmentID or peerID is a
// wildcard: ("s", "") retries every deadlettered record of segment s, ("",
// "p") every one for peer p (typically after p's outage), ("", "") all.
// With both ids given the record must exist (ErrNotFound) and be
// Deadletter (*TransitionError); wildcard forms skip records in other
// states. It returns the number of records moved. One transaction.
func (l *Ledger) RetryDeadletter(segmentID, peerID string, now time.Time) (int, error) {
	return l.operate("RetryDeadletter", segmentID, peerID, func(b buckets, r Record) error {
		n := r
		n.State, n.BudgetBase, n.NextAttemptAfter, n.UpdatedAt = StateScheduled, r.Attempts, now, now
		return b.put(&r, n)
	})
}

// Purge deletes deadlettered records: the operator gives up on them.
// Wildcards and errors as for RetryDeadletter. Note that while the segment
// is still stored and the peer still configured, the scheduler will create
// a fresh Scheduled record for the pair; to abandon delivery for good,
// also evict the segment or remove the peer from known_peers.
func (l *Ledger) Purge(segmentID, peerID string) (int, error) {
	return l.operate("Purge", segmentID, peerID, func(b buckets, r Record) error {
		return b.delete(r)
	})
}

// operate applies act to the Deadletter records selected by the ids.
func (l *Ledger) operate(op, seg, peer string, act func(b buckets, r Record) error) (int, error) {
	if seg != "" && peer != "" {
		if err := checkIDs(seg, peer); err != nil {
			return 0, fmt.Errorf("%s: %w", op, err)
		}
	}
	n := 0
	err := l.update(func(b buckets) error {
		n = 0
		if seg != "" && peer != "" {
			r, ok, err := b.get(seg, peer)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s %s/%s: %w", op, seg, peer, ErrNotFound)
			}
			if r.State != StateDeadletter {
				return &TransitionError{Op: op, SegmentID: seg, PeerID: peer, From: r.State}
			}
			n = 1
			return act(b, r)
		}
		var sel []Record
		collect := func(r Record) {
			if r.State == StateDeadletter && (peer == "" || r.PeerID == peer) {
				sel = append(sel, r)
			}
		}
		if seg != "" {
			rs, err := listSegment(b, seg)
			if err != nil {
				return err
			}
			for _, r := range rs {
				collect(r)
			}
		} else {
			err := b.records.ForEach(func(k, v []byte) error {
				r, err := decode(k, v)
				if err == nil {
					collect(r)
				}
				return err
			})
			if err != nil {
				return err
			}
		}
		// Mutate after the scan: bbolt cursors must not see their bucket
		// change under them.
		for _, r := range sel {
			if err := act(b, r); err != nil {
				return err
			}
		}
		n = len(sel)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}
