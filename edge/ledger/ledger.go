package ledger

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	rootBucket    = []byte("edge.ledger")
	recordsBucket = []byte("records")
	pendingBucket = []byte("pending")
)

// Ledger is the relay ledger over a caller-owned *bolt.DB. Methods are
// safe for concurrent use: each is one bbolt transaction, and bbolt runs
// read-write transactions one at a time, which is what makes every
// transition a compare-and-set. Every write is durable when the method
// returns nil (bbolt fsyncs on commit unless the DB was opened NoSync); a
// method that returns an error changed nothing.
type Ledger struct {
	db *bolt.DB
}

// Open creates the ledger's buckets if needed. The caller keeps ownership
// of db (and closes it after the last use of the Ledger).
func Open(db *bolt.DB) (*Ledger, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(rootBucket)
		if err != nil {
			return err
		}
		if _, err := root.CreateBucketIfNotExists(recordsBucket); err != nil {
			return err
		}
		_, err = root.CreateBucketIfNotExists(pendingBucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	return &Ledger{db: db}, nil
}

// buckets is the view of one transaction.
type buckets struct {
	records, pending *bolt.Bucket
}

func bucketsOf(tx *bolt.Tx) (buckets, error) {
	root := tx.Bucket(rootBucket)
	if root == nil {
		return buckets{}, errors.New("ledger buckets missing: ledger.Open was not run on this database")
	}
	return buckets{records: root.Bucket(recordsBucket), pending: root.Bucket(pendingBucket)}, nil
}

func (b buckets) get(seg, peer string) (Record, bool, error) {
	k := recKey(seg, peer)
	v := b.records.Get(k)
	if v == nil {
		return Record{}, false, nil
	}
	r, err := decode(k, v)
	return r, err == nil, err
}

// put writes r and keeps the pending index in step: old is the record as
// it was (nil when absent). This is the only writer of either bucket, so
// the index invariant (pending holds exactly the Scheduled and Failed
// records, keyed by their NextAttemptAfter) lives here.
func (b buckets) put(old *Record, r Record) error {
	if old != nil && old.State.pending() {
		if err := b.pending.Delete(pendKey(old.NextAttemptAfter, old.SegmentID, old.PeerID)); err != nil {
			return err
		}
	}
	v, err := encode(r)
	if err != nil {
		return err
	}
	if err := b.records.Put(recKey(r.SegmentID, r.PeerID), v); err != nil {
		return err
	}
	if r.State.pending() {
		return b.pending.Put(pendKey(r.NextAttemptAfter, r.SegmentID, r.PeerID), nil)
	}
	return nil
}

func (b buckets) delete(old Record) error {
	if old.State.pending() {
		if err := b.pending.Delete(pendKey(old.NextAttemptAfter, old.SegmentID, old.PeerID)); err != nil {
			return err
		}
	}
	return b.records.Delete(recKey(old.SegmentID, old.PeerID))
}

func (l *Ledger) update(fn func(b buckets) error) error {
	return l.db.Update(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		return fn(b)
	})
}

func (l *Ledger) view(fn func(b buckets) error) error {
	return l.db.View(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		return fn(b)
	})
}

// transition is the shared body of the single-record CAS operations:
// load, let step decide (returning the new record, or an error to refuse),
// store. A missing record is ErrNotFound.
func (l *Ledger) transition(op, seg, peer string, step func(r Record) (Record, error)) (Record, error) {
	if err := checkIDs(seg, peer); err != nil {
		return Record{}, fmt.Errorf("%s: %w", op, err)
	}
	var out Record
	err := l.update(func(b buckets) error {
		r, ok, err := b.get(seg, peer)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s %s/%s: %w", op, seg, peer, ErrNotFound)
		}
		n, err := step(r)
		if err != nil {
			return err
		}
		out = n
		return b.put(&r, n)
	})
	return out, err
}

// EnsureScheduled inserts a Scheduled record, due at now, for each peer
// that has none; existing records, in any state, are kept unchanged. It
// returns the peers for which a record was created. Idempotent, one
// transaction for all peers; safe to retry after any error.
func (l *Ledger) EnsureScheduled(segmentID string, peerIDs []string, now time.Time) ([]string, error) {
	created, err := l.ensureScheduled("EnsureScheduled "+segmentID, []Owed{{SegmentID: segmentID, PeerIDs: peerIDs}}, now)
	if err != nil {
		return nil, err
	}
	peers := make([]string, 0, len(created))
	for _, p := range created {
		peers = append(peers, p.PeerID)
	}
	if len(peers) == 0 {
		return nil, nil
	}
	return peers, nil
}

// Owed names the peers one segment is owed to, for EnsureScheduledAll.
type Owed struct {
	SegmentID string
	PeerIDs   []string
}

// EnsureScheduledAll is EnsureScheduled for many segments: every
// (segment, peer) pair without a record gets a Scheduled one, due at now,
// all in one write transaction, and none at all when every record exists
// (a read transaction finds that). It returns the pairs created, in the
// order given. Idempotent; safe to retry after any error. The caller
// bounds the batch: the transaction holds every record it writes.
//
// Start-up reconciliation calls it for the stored segments a chunk at a
// time. One transaction per segment cost a commit (two fsyncs) for every
// segment owed to a new peer: 10,000 segments after a peer was added, or
// after the database was rebuilt, took 2.7-2.8 s to start.
func (l *Ledger) EnsureScheduledAll(owed []Owed, now time.Time) ([]Pair, error) {
	return l.ensureScheduled("EnsureScheduledAll", owed, now)
}

func (l *Ledger) ensureScheduled(op string, owed []Owed, now time.Time) ([]Pair, error) {
	for _, o := range owed {
		for _, p := range o.PeerIDs {
			if err := checkIDs(o.SegmentID, p); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
	}
	// Nearly always every record exists (each start reconciles every
	// stored segment): answered without a write transaction's fsync.
	missing := false
	err := l.view(func(b buckets) error {
		for _, o := range owed {
			for _, p := range o.PeerIDs {
				_, ok, err := b.get(o.SegmentID, p)
				if err != nil {
					return err
				}
				if !ok {
					missing = true
					return nil
				}
			}
		}
		return nil
	})
	if err != nil || !missing {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return nil, nil
	}
	var created []Pair
	err = l.update(func(b buckets) (err error) {
		created, err = b.ensureScheduled(owed, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return created, nil
}

// EnsureScheduledIn is EnsureScheduledAll inside tx, a write transaction
// the caller opened on the shared database, which commits it: start-up
// reconciliation writes a batch's new records and the segment index's
// relayed markers in one commit (segstore's UpdateRelayed) instead of a
// commit (two fsyncs) each.
func (l *Ledger) EnsureScheduledIn(tx *bolt.Tx, owed []Owed, now time.Time) ([]Pair, error) {
	const op = "EnsureScheduledIn"
	for _, o := range owed {
		for _, p := range o.PeerIDs {
			if err := checkIDs(o.SegmentID, p); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
	}
	b, err := bucketsOf(tx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	created, err := b.ensureScheduled(owed, now)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return created, nil
}

// ensureScheduled writes a Scheduled record, due at now, for every pair
// of owed that has none, and returns the pairs it wrote.
func (b buckets) ensureScheduled(owed []Owed, now time.Time) ([]Pair, error) {
	var created []Pair
	for _, o := range owed {
		for _, p := range o.PeerIDs {
			if _, ok, err := b.get(o.SegmentID, p); err != nil || ok {
				if err != nil {
					return nil, err
				}
				continue
			}
			r := Record{SegmentID: o.SegmentID, PeerID: p, State: StateScheduled, NextAttemptAfter: now, UpdatedAt: now}
			if err := b.put(nil, r); err != nil {
				return nil, err
			}
			created = append(created, Pair{SegmentID: o.SegmentID, PeerID: p})
		}
	}
	return created, nil
}

// TryTransitionInflight claims a record for one attempt: Scheduled →
// Inflight, or Failed with NextAttemptAfter ≤ now → Inflight, counting the
// attempt. It returns claimed=false with a nil error when the record is
// not claimable right now: Inflight (another worker claimed it) or Failed
// and not yet due. A terminal record (Acked, Deadletter) is refused with a
// *TransitionError; either way the worker skips it.
func (l *Ledger) TryTransitionInflight(segmentID, peerID string, now time.Time) (Record, bool, error) {
	const op = "TryTransitionInflight"
	claimed := false
	var current Record
	r, err := l.transition(op, segmentID, peerID, func(r Record) (Record, error) {
		switch {
		case r.State == StateScheduled, r.State == StateFailed && !r.NextAttemptAfter.After(now):
		case r.State == StateInflight, r.State == StateFailed:
			current = r
			return r, errNotClaimable
		default:
			return r, &TransitionError{Op: op, SegmentID: segmentID, PeerID: peerID, From: r.State}
		}
		claimed = true
		r.State, r.Attempts, r.NextAttemptAfter, r.DeferredFrom, r.UpdatedAt = StateInflight, r.Attempts+1, time.Time{}, time.Time{}, now
		return r, nil
	})
	if errors.Is(err, errNotClaimable) {
		return current, false, nil
	}
	return r, claimed, err
}

// errNotClaimable aborts the claim transaction without changing anything.
var errNotClaimable = errors.New("not claimable now")

// TransitionAcked records the peer's ACK: Inflight → Acked (terminal).
// LastError is cleared: it described an earlier failed attempt, and an
// acked record still carrying it reads as failed (Attempts keeps the
// history of how many tries it took).
func (l *Ledger) TransitionAcked(segmentID, peerID string, now time.Time) (Record, error) {
	const op = "TransitionAcked"
	return l.transition(op, segmentID, peerID, func(r Record) (Record, error) {
		if r.State != StateInflight {
			return r, &TransitionError{Op: op, SegmentID: segmentID, PeerID: peerID, From: r.State}
		}
		r.State, r.LastError, r.UpdatedAt = StateAcked, "", now
		return r, nil
	})
}

// TransitionFailed records a failed attempt: Inflight → Failed, due again
// at now + p.Backoff(BudgetUsed), or Inflight → Deadletter when BudgetUsed
// ≥ p.MaxRetries. cause becomes LastError.
func (l *Ledger) TransitionFailed(segmentID, peerID string, cause error, now time.Time, p Policy) (Record, error) {
	const op = "TransitionFailed"
	if err := p.Validate(); err != nil {
		return Record{}, fmt.Errorf("%s: %w", op, err)
	}
	return l.transition(op, segmentID, peerID, func(r Record) (Record, error) {
		if r.State != StateInflight {
			return r, &TransitionError{Op: op, SegmentID: segmentID, PeerID: peerID, From: r.State}
		}
		return failed(r, errText(cause), now, p), nil
	})
}

// failed applies the retry budget to an Inflight record.
func failed(r Record, cause string, now time.Time, p Policy) Record {
	r.LastError, r.UpdatedAt = truncate(cause), now
	if r.BudgetUsed() >= p.MaxRetries {
		r.State, r.NextAttemptAfter = StateDeadletter, time.Time{}
		return r
	}
	r.State, r.NextAttemptAfter = StateFailed, now.Add(p.Backoff(r.BudgetUsed()))
	return r
}

func errText(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// Get returns the record for (segmentID, peerID), or ErrNotFound.
func (l *Ledger) Get(segmentID, peerID string) (Record, error) {
	if err := checkIDs(segmentID, peerID); err != nil {
		return Record{}, fmt.Errorf("get: %w", err)
	}
	var out Record
	err := l.view(func(b buckets) error {
		r, ok, err := b.get(segmentID, peerID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("get %s/%s: %w", segmentID, peerID, ErrNotFound)
		}
		out = r
		return nil
	})
	return out, err
}

// Pending returns up to limit records (all when limit ≤ 0) in Scheduled
// or Failed state whose NextAttemptAfter ≤ now, ordered by
// (NextAttemptAfter, SegmentID, PeerID). The order is a property of the
// index keys, not of any sort at read time. Pending only reads: a worker
// must still win TryTransitionInflight.
func (l *Ledger) Pending(now time.Time, limit int) ([]Record, error) {
	var out []Record
	err := l.view(func(b buckets) error {
		c := b.pending.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			if pendTime(k).After(now) {
				break
			}
			seg, peer, ok := splitKey(k[8:])
			if !ok {
				return fmt.Errorf("malformed pending key %q", k)
			}
			r, found, err := b.get(seg, peer)
			if err != nil {
				return err
			}
			if !found {
				return fmt.Errorf("pending index names %s/%s but no record exists", seg, peer)
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pending: %w", err)
	}
	return out, nil
}

// ListBySegment returns the segment's records ordered by peer id.
func (l *Ledger) ListBySegment(segmentID string) ([]Record, error) {
	var out []Record
	err := l.view(func(b buckets) error {
		var err error
		out, err = listSegment(b, segmentID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list segment %s: %w", segmentID, err)
	}
	return out, nil
}

func listSegment(b buckets, seg string) ([]Record, error) {
	var out []Record
	prefix := recKey(seg, "")
	c := b.records.Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		r, err := decode(k, v)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func hasPrefix(k, p []byte) bool { return len(k) >= len(p) && string(k[:len(p)]) == string(p) }

// ListByState returns every record in state s ordered by (SegmentID,
// PeerID). It scans all records: meant for operators, not the hot path.
func (l *Ledger) ListByState(s State) ([]Record, error) {
	var out []Record
	err := l.each(func(r Record) error {
		if r.State == s {
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s, err)
	}
	return out, nil
}

// Counts returns the number of records in each state (for status RPCs).
func (l *Ledger) Counts() (map[State]int, error) {
	out := map[State]int{}
	err := l.each(func(r Record) error { out[r.State]++; return nil })
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	return out, nil
}

func (l *Ledger) each(fn func(Record) error) error {
	return l.view(func(b buckets) error {
		return b.records.ForEach(func(k, v []byte) error {
			r, err := decode(k, v)
			if err != nil {
				return err
			}
			return fn(r)
		})
	})
}
