package relaycore

import (
	"errors"
	"fmt"
)

// ErrMaybeApplied marks a store error after which the batch may or may not
// have been applied (the request was sent and its outcome is unknown).
// Stores wrap it; callers test with MayBeApplied.
var ErrMaybeApplied = errors.New("outcome unknown: batch may have been applied")

// ErrBatchTooLarge means a batch exceeds the store's item or byte limit.
// The batch was surely not applied.
var ErrBatchTooLarge = errors.New("batch exceeds store limits")

// ErrValueTooLarge means one item exceeds the store's item size limit. The
// batch was surely not applied.
var ErrValueTooLarge = errors.New("item exceeds store item size limit")

// ErrInvalidBatch means a batch is malformed (empty, a key written twice,
// an empty key). The batch was surely not applied.
var ErrInvalidBatch = errors.New("invalid batch")

// ConditionFailedError reports that precondition Index of a batch was false
// at commit time. The batch was surely not applied.
type ConditionFailedError struct {
	Index int
	Key   string
}

func (e *ConditionFailedError) Error() string {
	return fmt.Sprintf("precondition %d on key %q failed", e.Index, e.Key)
}

// MayBeApplied reports whether err leaves the batch's outcome unknown.
func MayBeApplied(err error) bool { return errors.Is(err, ErrMaybeApplied) }

// FailedPrecondition returns the failed precondition's index and true when
// err is (or wraps) a *ConditionFailedError.
func FailedPrecondition(err error) (int, bool) {
	var cf *ConditionFailedError
	if errors.As(err, &cf) {
		return cf.Index, true
	}
	return 0, false
}
