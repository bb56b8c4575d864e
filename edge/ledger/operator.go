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

// Resend makes (segmentID, peerID) due again at now: the peer is to be
// sent the segment once more although the record may say it has it. It is
// for a peer that lost its copy after acknowledging it (it found the copy
// damaged and quarantined it: the peer asks with a wire WANT, or an
// operator with edgectl relay resend), so it applies to an Acked record
// above all: Acked, Failed, Scheduled or Deadletter → Scheduled, due at
// now, with a fresh retry budget (BudgetBase = Attempts; Attempts is
// kept). An absent record is created Scheduled (the peer may be the one
// the segment came from, which is owed nothing until it asks). An
// Inflight record is being sent right now and is left alone: it is
// returned unchanged with resent false and no error, since the attempt
// under way delivers what was asked; a Scheduled record already due is
// left as it is too (resent true). It returns the record as it is
// after the call. Whether the segment is stored is the caller's check.
// Idempotent; one transaction; safe to retry after any error.
func (l *Ledger) Resend(segmentID, peerID string, now time.Time) (r Record, resent bool, err error) {
	rs, sent, err := l.ResendAll([]Pair{{SegmentID: segmentID, PeerID: peerID}}, now)
	if err != nil {
		return Record{}, false, err
	}
	return rs[0], sent[0], nil
}

// ResendAll is Resend for several pairs in one transaction (a peer's WANT
// names up to 4096 segments: one commit, not one each). It returns each
// pair's record and resent flag, in the order given. A pair that does not
// need a write (Inflight, or Scheduled and due) costs none; when no pair
// does, no write transaction is opened.
func (l *Ledger) ResendAll(pairs []Pair, now time.Time) ([]Record, []bool, error) {
	for _, p := range pairs {
		if err := checkIDs(p.SegmentID, p.PeerID); err != nil {
			return nil, nil, fmt.Errorf("Resend: %w", err)
		}
	}
	out, resent := make([]Record, len(pairs)), make([]bool, len(pairs))
	// resendStep decides one pair; write is false when the record stays.
	step := func(b buckets, i int) (old Record, had, write bool, err error) {
		p := pairs[i]
		old, had, err = b.get(p.SegmentID, p.PeerID)
		if err != nil {
			return old, had, false, err
		}
		switch {
		case had && old.State == StateInflight:
			out[i], resent[i] = old, false
			return old, had, false, nil
		case had && old.State == StateScheduled && !old.NextAttemptAfter.After(now):
			out[i], resent[i] = old, true // due already: rewriting it would only move it back
			return old, had, false, nil
		}
		r := Record{SegmentID: p.SegmentID, PeerID: p.PeerID, State: StateScheduled, NextAttemptAfter: now, UpdatedAt: now}
		if had {
			r.Attempts, r.BudgetBase, r.LastError = old.Attempts, old.Attempts, old.LastError
		}
		out[i], resent[i] = r, true
		return old, had, true, nil
	}
	writes := false
	err := l.view(func(b buckets) error {
		for i := range pairs {
			_, _, w, err := step(b, i)
			if err != nil {
				return err
			}
			writes = writes || w
		}
		return nil
	})
	if err == nil && writes {
		err = l.update(func(b buckets) error {
			for i := range pairs {
				old, had, w, err := step(b, i)
				if err != nil || !w {
					if err != nil {
						return err
					}
					continue
				}
				if had {
					err = b.put(&old, out[i])
				} else {
					err = b.put(nil, out[i])
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("Resend: %w", err)
	}
	return out, resent, nil
}
