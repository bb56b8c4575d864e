package ledger

import (
	"errors"
	"fmt"
)

// ErrNotFound means no record exists for the (segment, peer) pair.
var ErrNotFound = errors.New("no ledger record")

// ErrIllegalTransition is wrapped by every *TransitionError: the record's
// current state does not allow the operation. Nothing was changed.
var ErrIllegalTransition = errors.New("illegal ledger transition")

// ErrInvalidID means a segment or peer id is empty, too long, or holds a
// NUL byte. Nothing was changed.
var ErrInvalidID = errors.New("invalid ledger id")

// ErrInvalidPolicy means a retry Policy has MaxRetries < 1, Initial ≤ 0 or
// Max < Initial. Nothing was changed.
var ErrInvalidPolicy = errors.New("invalid retry policy")

// ErrUnknownCondition means a success condition is neither OnePeer nor
// AllPeers.
var ErrUnknownCondition = errors.New("unknown success condition")

// ErrEvictionBlocked is returned by an EvictionGate when the segment may
// not be evicted yet (see CanEvict). Nothing was changed.
var ErrEvictionBlocked = errors.New("eviction blocked by relay ledger")

// TransitionError reports an operation refused because of the record's
// current state. It unwraps to ErrIllegalTransition.
type TransitionError struct {
	Op        string // the refused operation, e.g. "TransitionAcked"
	SegmentID string
	PeerID    string
	From      State // the record's state when the operation was refused
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("%s %s/%s: not allowed from %s", e.Op, e.SegmentID, e.PeerID, e.From)
}

// Unwrap lets errors.Is(err, ErrIllegalTransition) match.
func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }
