package ledger

import (
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Condition is relay.success_condition.
type Condition string

// The success conditions (the same strings as edge/config.OnePeer and
// edge/config.AllPeers).
const (
	OnePeer  Condition = "one_peer"
	AllPeers Condition = "all_peers"
)

// Valid reports whether c is a known condition.
func (c Condition) Valid() bool { return c == OnePeer || c == AllPeers }

// Assurance says how far a segment's delivery to its required peers got.
type Assurance struct {
	// AckedPeers are the required peers whose record is Acked, ascending.
	AckedPeers []string
	// Met is the success condition over the required peers:
	//   all_peers: every required peer is in AckedPeers;
	//   one_peer:  AckedPeers is not empty.
	// With no required peers Met is false under both conditions: nobody
	// holds a copy, so nothing is assured.
	Met bool
}

// Assurance evaluates condition c for segmentID over requiredPeers (the
// configured known_peers). Acked records of peers not in requiredPeers (a
// peer removed from the config) do not count. Read-only.
func (l *Ledger) Assurance(segmentID string, requiredPeers []string, c Condition) (Assurance, error) {
	var out Assurance
	err := l.view(func(b buckets) error {
		var err error
		out, _, err = evaluate(b, segmentID, requiredPeers, c)
		return err
	})
	if err != nil {
		return Assurance{}, fmt.Errorf("assurance %s: %w", segmentID, err)
	}
	return out, nil
}

// CanEvict reports whether the local copy of segmentID may be deleted.
// It is true exactly when
//
//  1. the success condition c is Met over requiredPeers (see Assurance), and
//  2. no required peer's record is Scheduled, Inflight or Failed: a
//     delivery still owed to a required peer must not lose its source
//     (under one_peer the other peers' deliveries finish, Acked or
//     Deadletter, before eviction), and
//  3. no record of the segment, for any peer, is Inflight: a worker is
//     reading the file.
//
// A required peer with no record does not block (2): under one_peer it
// was never scheduled and will not be; under all_peers it already fails (1).
// Read-only; for eviction itself use EvictionGate, which checks in the
// same transaction that deletes the index entry.
func (l *Ledger) CanEvict(segmentID string, requiredPeers []string, c Condition) (bool, error) {
	var ok bool
	err := l.view(func(b buckets) error {
		var err error
		_, ok, err = evaluate(b, segmentID, requiredPeers, c)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("can evict %s: %w", segmentID, err)
	}
	return ok, nil
}

// EvictionGate returns a check for edge/segstore's EvictIf, run inside the
// transaction that removes the segment's index entry, so no ledger change
// can slip between the check and the eviction. It returns nil when
// CanEvict holds and an error wrapping ErrEvictionBlocked otherwise. The
// segment store and the ledger must share the *bolt.DB.
func (l *Ledger) EvictionGate(segmentID string, requiredPeers []string, c Condition) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		a, ok, err := evaluate(b, segmentID, requiredPeers, c)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: segment %s, condition %s, acked by %v of %v",
				ErrEvictionBlocked, segmentID, c, a.AckedPeers, requiredPeers)
		}
		return nil
	}
}

// Standing is one segment's standing in the ledger over its required
// peers, as start-up reconciliation needs it: its Assurance, and the
// required peers that have no record for it yet.
type Standing struct {
	Assurance
	// Unrecorded are the required peers without a record of the
	// segment, in the order given, each once (EnsureScheduledIn creates
	// their records).
	Unrecorded []string
}

// StandingAll returns the Standing under condition c of every segment of
// owed over its PeerIDs (its required peers), in the order given, from
// one read transaction that reads each segment's records once. Start-up
// reconciliation asks it for each batch of stored segments: three read
// transactions per segment before (a Stat and two Assurance reads), each
// allocating its transaction, buckets and cursors and decoding the
// records again, were most of a plain restart's garbage with 10,000
// segments stored. Read-only.
func (l *Ledger) StandingAll(owed []Owed, c Condition) ([]Standing, error) {
	if !c.Valid() {
		return nil, fmt.Errorf("StandingAll: %w: %q", ErrUnknownCondition, c)
	}
	for _, o := range owed {
		for _, p := range o.PeerIDs {
			if err := checkIDs(o.SegmentID, p); err != nil {
				return nil, fmt.Errorf("StandingAll: %w", err)
			}
		}
	}
	out := make([]Standing, len(owed))
	err := l.view(func(b buckets) error {
		for i, o := range owed {
			recs, err := listSegment(b, o.SegmentID)
			if err != nil {
				return err
			}
			out[i].Assurance, _ = assess(recs, o.PeerIDs, c)
			for _, p := range o.PeerIDs {
				has := func(r Record) bool { return r.PeerID == p }
				if !slices.ContainsFunc(recs, has) && !slices.Contains(out[i].Unrecorded, p) {
					out[i].Unrecorded = append(out[i].Unrecorded, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("StandingAll: %w", err)
	}
	return out, nil
}

// evaluate computes the Assurance and the CanEvict verdict in one read.
func evaluate(b buckets, seg string, required []string, c Condition) (Assurance, bool, error) {
	if !c.Valid() {
		return Assurance{}, false, fmt.Errorf("%w: %q", ErrUnknownCondition, c)
	}
	recs, err := listSegment(b, seg)
	if err != nil {
		return Assurance{}, false, err
	}
	a, ok := assess(recs, required, c)
	return a, ok, nil
}

// assess is evaluate over the segment's records recs; c is valid.
func assess(recs []Record, required []string, c Condition) (Assurance, bool) {
	req := slices.Sorted(slices.Values(required))
	req = slices.Compact(req)
	var a Assurance
	blocked := false
	for _, r := range recs {
		_, isReq := slices.BinarySearch(req, r.PeerID)
		switch {
		case r.State == StateInflight:
			blocked = true
		case isReq && r.State == StateAcked:
			a.AckedPeers = append(a.AckedPeers, r.PeerID)
		case isReq && !r.State.Terminal():
			blocked = true
		}
	}
	switch c {
	case AllPeers:
		a.Met = len(req) > 0 && len(a.AckedPeers) == len(req)
	case OnePeer:
		a.Met = len(a.AckedPeers) > 0
	}
	return a, a.Met && !blocked
}
