package ledger

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// State is where delivery of one segment to one peer stands.
type State uint8

// The delivery states; see the package documentation for transitions.
// The numeric values are stored on disk: do not renumber.
const (
	StateScheduled  State = 1
	StateInflight   State = 2
	StateAcked      State = 3
	StateFailed     State = 4
	StateDeadletter State = 5
	// StateCancelled is never stored as 6: on disk it is StateDeadletter
	// with "cancelled": true (see stored), so an edged older than it, whose
	// start-up check refuses unknown states and would set the whole
	// database aside, reads a cancelled record as a deadletter: terminal
	// for it too.
	StateCancelled State = 6
)

// States lists every state in numeric order.
func States() []State {
	return []State{StateScheduled, StateInflight, StateAcked, StateFailed, StateDeadletter, StateCancelled}
}

func (s State) String() string {
	switch s {
	case StateScheduled:
		return "scheduled"
	case StateInflight:
		return "inflight"
	case StateAcked:
		return "acked"
	case StateFailed:
		return "failed"
	case StateDeadletter:
		return "deadletter"
	case StateCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState is the inverse of String (for CLI filters).
func ParseState(s string) (State, error) {
	for _, st := range States() {
		if st.String() == strings.ToLower(s) {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown ledger state %q (scheduled, inflight, acked, failed, deadletter, cancelled)", s)
}

// Terminal reports whether automatic execution never moves the record
// again: Acked, Deadletter (which only an operator moves) and Cancelled.
func (s State) Terminal() bool {
	return s == StateAcked || s == StateDeadletter || s == StateCancelled
}

// pending reports whether records in s are in the pending index.
func (s State) pending() bool { return s == StateScheduled || s == StateFailed }

// Record is the ledger's view of one (segment, peer) pair.
type Record struct {
	SegmentID string
	PeerID    string
	State     State
	// Attempts counts attempts started; it never decreases.
	Attempts int
	// BudgetBase is Attempts at the start of the current retry budget.
	BudgetBase int
	// NextAttemptAfter orders pending records; a Failed record is not
	// retried before it. Zero for Inflight, Acked and Deadletter records.
	NextAttemptAfter time.Time
	// DeferredFrom is the NextAttemptAfter the record had when the relay's
	// dial circuit first deferred it (Defer), while that deferral stands;
	// zero otherwise. The circuit lives in the memory of the process that
	// deferred the record: at the next start ReleaseDeferred puts the
	// record back where it was, so a restart does not wait out a circuit
	// that belonged to the previous process.
	DeferredFrom time.Time
	// LastError is the most recent failure, truncated to MaxErrorLen bytes;
	// empty once the record is Acked.
	LastError string
	// UpdatedAt is the now of the last change.
	UpdatedAt time.Time
}

// BudgetUsed is the number of attempts made in the current retry budget.
func (r Record) BudgetUsed() int { return r.Attempts - r.BudgetBase }

// MaxIDLen bounds segment and peer ids (bbolt keys stay small).
const MaxIDLen = 1024

// MaxErrorLen bounds a stored LastError.
const MaxErrorLen = 1024

// stored is the on-disk JSON form. Times are unix nanoseconds so the
// pending key derived from a record is reproduced exactly (0 = zero time).
type stored struct {
	State      State  `json:"state"`
	Attempts   int    `json:"attempts"`
	BudgetBase int    `json:"budget_base"`
	NextNS     int64  `json:"next_ns,omitempty"`
	DeferredNS int64  `json:"deferred_ns,omitempty"`
	LastError  string `json:"last_error,omitempty"`
	UpdatedNS  int64  `json:"updated_ns"`
	// Cancelled marks a StateCancelled record, stored as StateDeadletter.
	Cancelled bool `json:"cancelled,omitempty"`
}

func encode(r Record) ([]byte, error) {
	s := stored{
		State: r.State, Attempts: r.Attempts, BudgetBase: r.BudgetBase,
		NextNS: nanos(r.NextAttemptAfter), LastError: r.LastError, UpdatedNS: nanos(r.UpdatedAt),
	}
	if r.State == StateCancelled {
		s.State, s.Cancelled = StateDeadletter, true
	}
	if r.State.pending() {
		// A deferral ends with the record's claim (or any state change):
		// it is never stored with a record that is not pending.
		s.DeferredNS = nanos(r.DeferredFrom)
	}
	return json.Marshal(s)
}

func decode(key, val []byte) (Record, error) {
	seg, peer, ok := splitKey(key)
	if !ok {
		return Record{}, fmt.Errorf("decode ledger record: malformed key %q", key)
	}
	var s stored
	if err := json.Unmarshal(val, &s); err != nil {
		return Record{}, fmt.Errorf("decode ledger record %s/%s: %w", seg, peer, err)
	}
	switch {
	case s.State == StateCancelled:
		return Record{}, fmt.Errorf("decode ledger record %s/%s: state %d is never stored", seg, peer, s.State)
	case s.Cancelled && s.State != StateDeadletter:
		return Record{}, fmt.Errorf("decode ledger record %s/%s: cancelled in state %d", seg, peer, s.State)
	case s.Cancelled:
		s.State = StateCancelled
	}
	r := Record{
		SegmentID: seg, PeerID: peer, State: s.State, Attempts: s.Attempts, BudgetBase: s.BudgetBase,
		NextAttemptAfter: fromNanos(s.NextNS), DeferredFrom: fromNanos(s.DeferredNS), LastError: s.LastError,
		UpdatedAt: fromNanos(s.UpdatedNS),
	}
	if r.State == StateAcked {
		// Versions before TransitionAcked cleared it stored the error of
		// an earlier attempt with the ACK; it is not shown either.
		r.LastError = ""
	}
	return r, nil
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func recKey(seg, peer string) []byte {
	k := make([]byte, 0, len(seg)+1+len(peer))
	k = append(k, seg...)
	k = append(k, 0)
	return append(k, peer...)
}

func splitKey(k []byte) (seg, peer string, ok bool) {
	i := bytes.IndexByte(k, 0)
	if i <= 0 || i == len(k)-1 {
		return "", "", false
	}
	return string(k[:i]), string(k[i+1:]), true
}

// pendKey sorts by time, then segment, then peer. Flipping the sign bit
// makes the big-endian bytes of an int64 sort like the integer.
func pendKey(t time.Time, seg, peer string) []byte {
	k := make([]byte, 8, 8+len(seg)+1+len(peer))
	binary.BigEndian.PutUint64(k, uint64(nanos(t))^(1<<63))
	return append(k, recKey(seg, peer)...)
}

func pendTime(k []byte) time.Time {
	return fromNanos(int64(binary.BigEndian.Uint64(k[:8]) ^ (1 << 63)))
}

func checkIDs(seg, peer string) error {
	for _, id := range [...]string{seg, peer} {
		if id == "" || len(id) > MaxIDLen || strings.IndexByte(id, 0) >= 0 {
			return fmt.Errorf("%w: %q", ErrInvalidID, id)
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) <= MaxErrorLen {
		return s
	}
	return s[:MaxErrorLen]
}
