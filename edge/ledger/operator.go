package ledger

import (
	"errors"
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
// states. It returns the records it moved, as they were before (so the
// operator sees which ones, with the error that deadlettered them), in
// (segment, peer) order. One transaction.
func (l *Ledger) RetryDeadletter(segmentID, peerID string, now time.Time) ([]Record, error) {
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
func (l *Ledger) Purge(segmentID, peerID string) ([]Record, error) {
	return l.operate("Purge", segmentID, peerID, func(b buckets, r Record) error {
		return b.delete(r)
	})
}

// operate applies act to the Deadletter records selected by the ids and
// returns them as they were.
func (l *Ledger) operate(op, seg, peer string, act func(b buckets, r Record) error) ([]Record, error) {
	if seg != "" && peer != "" {
		if err := checkIDs(seg, peer); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	var sel []Record
	err := l.update(func(b buckets) error {
		sel = nil
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
			sel = []Record{r}
			return act(b, r)
		}
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
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return sel, nil
}

// HasPeer reports whether any record, in any state, is for peerID. An
// operator's selector naming a peer without records is a typo or a peer
// this node never dealt with; the RPC refuses it rather than report "0
// records". It scans every record: meant for operators.
func (l *Ledger) HasPeer(peerID string) (bool, error) {
	found := false
	err := l.view(func(b buckets) error {
		return b.records.ForEach(func(k, _ []byte) error {
			if _, p, ok := splitKey(k); ok && p == peerID {
				found = true
				return errStopScan
			}
			return nil
		})
	})
	if err != nil && !errors.Is(err, errStopScan) {
		return false, fmt.Errorf("has peer %s: %w", peerID, err)
	}
	return found, nil
}

// errStopScan ends a ForEach early.
var errStopScan = errors.New("stop scan")
