package relaycore

import (
	"errors"
	"fmt"
)

// Every error the engine and its storage contract return, grouped by the
// operation that returns them. Callers test them with errors.Is (the typed
// errors below each wrap one of them; errors.As reads their details), so a
// host such as the HTTP API maps them to answers in one place.

// These errors can be returned by a Store's Apply (and so by every engine
// operation that writes). Each says whether the batch was applied.
var (
	// ErrMaybeApplied marks a store error after which the batch may or may
	// not have been applied (the request was sent and its outcome is
	// unknown). Stores wrap it; callers test with MayBeApplied.
	ErrMaybeApplied = errors.New("outcome unknown: batch may have been applied")

	// ErrBatchTooLarge means a batch exceeds the store's item or byte
	// limit. The batch was surely not applied.
	ErrBatchTooLarge = errors.New("batch exceeds store limits")

	// ErrValueTooLarge means one item exceeds the store's item size limit.
	// The batch was surely not applied.
	ErrValueTooLarge = errors.New("item exceeds store item size limit")

	// ErrInvalidBatch means a batch is malformed (empty, a key written
	// twice, an empty key). The batch was surely not applied.
	ErrInvalidBatch = errors.New("invalid batch")

	// ErrUnavailable marks a store error of the store being out of reach
	// or overloaded for the moment (a connection refused or lost, a
	// timeout, throttling beyond the store's retries, a server shutting
	// down or in recovery), not of the request: the same call may succeed
	// later. Any Store call may return it. From Apply it comes alone when
	// the batch was surely not applied and together with ErrMaybeApplied
	// when it may have been. Stores wrap it; a host answers it as "retry
	// later" (the HTTP API: 503 unavailable) instead of an internal error.
	ErrUnavailable = errors.New("store unavailable")

	// ErrNoDueIndex means a wrapper (CountingStore) was asked for due
	// entries but the store it wraps keeps no due index. Nothing was read.
	ErrNoDueIndex = errors.New("store has no due index")
)

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

// These errors can be returned by any engine operation on a source:
// enqueue, fire, alarm and operator actions.
var (
	// ErrCorruptRecord means a relay record (os, rs, lease, alarm, rh or a
	// row page) could not be decoded. The engine never overwrites what it
	// cannot read.
	ErrCorruptRecord = errors.New("corrupt relay record")

	// ErrContention means an engine compare-and-set kept losing to other
	// writers (an enqueue on os, a fire's checkpoint on rs, an alarm
	// clearing its record, an operator action re-reading what an enqueue
	// changed). What committed before it stays committed; retrying later
	// is safe.
	ErrContention = errors.New("relay compare-and-set lost too many races")
)

// These errors can be returned when enqueueing rows (RelayHandler.Enqueue).
var (
	// ErrInvalidRow means a relay row was refused before anything was
	// written. The concrete error is a *RowError naming the row and the
	// reason.
	ErrInvalidRow = errors.New("invalid relay row")

	// ErrInvalidSourceID means the source id breaks the one rule for ids
	// (SourceIDProblem: 1..255 bytes of UTF-8 text without control
	// characters, not starting with "_relay/"); nothing was written. The
	// operator routes and the relay CLI refuse such an id, so a source
	// enqueued under one could not be operated.
	ErrInvalidSourceID = errors.New("invalid source id")

	// ErrDeadlineExceeded means the clock reached the enqueue deadline
	// (the caller's deadline or lease expiry minus the skew margin) before
	// a batch was sent. Batches committed before it stay committed (see
	// CommitResult).
	ErrDeadlineExceeded = errors.New("relay enqueue deadline exceeded")

	// ErrCommitUnknown means an enqueue batch's outcome stayed ambiguous
	// after re-reading (the store said it may have been applied and the
	// evidence was already gone). Its rows may or may not be in the
	// outbox; the caller must not assume either.
	ErrCommitUnknown = errors.New("relay enqueue outcome unknown")

	// ErrInvalidIdempotencyKey means EnqueueOptions.IdempotencyKey is not
	// 1..128 bytes of [A-Za-z0-9._:-]. Nothing was read or written.
	ErrInvalidIdempotencyKey = errors.New("invalid idempotency key")

	// ErrIdempotencyKeyReused means a live idempotency record holds the
	// key for different rows (another digest): the request was refused and
	// nothing was written. Use a new key for new rows.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with different rows")

	// ErrIdempotentRequestTooLarge means rows sent with an idempotency key
	// do not fit one source batch together with the idempotency record
	// (the guarantee needs one atomic commit). Nothing was written. On
	// DynamoDB a batch holds 100 items and 4 MB; os, alarm and the record
	// take three (a lease a fourth), leaving 97 items for the pages and one
	// target record per distinct target: with the default 8 KB pages about
	// 760 KB of row data (more where it compresses) for a few targets, and
	// at most 48 distinct targets. Split larger requests into several
	// keyed requests.
	ErrIdempotentRequestTooLarge = errors.New("idempotent enqueue does not fit one batch")
)

// RowError names the input row (by index) that enqueue validation refused
// and why. It wraps ErrInvalidRow.
type RowError struct {
	Index  int
	Reason string
}

func (e *RowError) Error() string { return fmt.Sprintf("relay row %d: %s", e.Index, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalidRow) true.
func (e *RowError) Unwrap() error { return ErrInvalidRow }

// These errors can be returned by the source lease (AcquireLease, and an
// enqueue on a source that requires one).
var (
	// ErrLeaseRequired means the source was declared lease-required
	// (DeclareLeaseRequired) and the caller supplied no lease. Nothing was
	// written.
	ErrLeaseRequired = errors.New("source requires a lease")

	// ErrStaleLease means the caller's lease no longer matches the
	// source's lease record (taken over, renewed by someone else, released
	// or expired). The operation failed closed: the batch that noticed it
	// was not applied.
	ErrStaleLease = errors.New("stale source lease")

	// ErrLeaseHeld means AcquireLease found a live lease of another holder.
	ErrLeaseHeld = errors.New("source lease held by another holder")
)

// This error can be returned when configuring the engine.
var (
	// ErrUnknownPlan means PlanBudget was given a plan name other than free
	// or paid.
	ErrUnknownPlan = errors.New("unknown relay plan")
)

// These errors can be returned by the operator actions (Quarantine,
// Release, Pause, Resume, Skip), by Actor.Validate and SkipRequest.Validate,
// and by the operator reads (GetTarget, the archive). A refused action
// changes no target: one refused under the source's claim has only taken
// and released the claim (rs is rewritten).
var (
	// ErrSourceBusy means a fire holds the source's claim; retry shortly.
	ErrSourceBusy = errors.New("source busy: a fire is running")

	// ErrUnknownTarget means the source has no record of the target.
	ErrUnknownTarget = errors.New("unknown target")

	// ErrInvalidOperatorInput means a malformed operator request (reason
	// too long or not text, no reason for a skip, a bad range, an unknown
	// action).
	ErrInvalidOperatorInput = errors.New("invalid operator request")

	// ErrWrongState means the action does not apply in the target's state
	// (Action.AllowedIn says where it does; TargetStateError says which
	// state it met).
	ErrWrongState = errors.New("action not allowed in the target's state")

	// ErrSkipConflict means the skip's expected first seq is not the
	// target's first undelivered held row (SkipConflictError says which
	// is).
	ErrSkipConflict = errors.New("skip expectation does not hold")

	// ErrSkipRange means the skip goes past the target's last held row.
	ErrSkipRange = errors.New("skip past the last held row")

	// ErrSkipTooLarge means the skip does not fit one batch; skip in steps
	// (the message names the last seq one request may skip through).
	ErrSkipTooLarge = errors.New("skip too large for one request")

	// ErrArchiveNotFound means no dead-row archive entry has that id.
	ErrArchiveNotFound = errors.New("archive entry not found")
)

// TargetStateError means Action is not allowed while the target is in
// State. It wraps ErrWrongState.
type TargetStateError struct {
	Target Partition
	State  TargetState
	Action Action
}

func (e *TargetStateError) Error() string {
	return fmt.Sprintf("%s target %q: it is %s", e.Action, e.Target, e.State)
}

// Unwrap makes errors.Is(err, ErrWrongState) true.
func (e *TargetStateError) Unwrap() error { return ErrWrongState }

// SkipConflictError means the skip expected Expected to be the first
// undelivered held row; Actual is (0: none is held). It wraps
// ErrSkipConflict.
type SkipConflictError struct {
	Target           Partition
	Expected, Actual uint64
	Reason           string
}

func (e *SkipConflictError) Error() string {
	return fmt.Sprintf("skip target %q from %d: %s (first undelivered held seq: %d)", e.Target, e.Expected, e.Reason, e.Actual)
}

// Unwrap makes errors.Is(err, ErrSkipConflict) true.
func (e *SkipConflictError) Unwrap() error { return ErrSkipConflict }

// These errors can be returned for takedown requests (TakedownRequestTimer
// and the rows that carry one).
var (
	// ErrInvalidTakedown means a takedown request (or a row carrying one)
	// is malformed. From TakedownRequestTimer it blocks the target for the
	// cycle and leaves its rows queued: a request is never dropped, and
	// never handed off half-read. The concrete error is a *TakedownError.
	ErrInvalidTakedown = errors.New("invalid takedown request")
)

// TakedownError says which row and key carried a malformed takedown request
// and why. It wraps ErrInvalidTakedown.
type TakedownError struct {
	Seq    uint64 // the row's seq (0 outside the relay)
	Key    string
	Reason string
}

func (e *TakedownError) Error() string {
	if e.Seq == 0 {
		return fmt.Sprintf("takedown request %q: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("takedown request %q in row %d: %s", e.Key, e.Seq, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidTakedown) true.
func (e *TakedownError) Unwrap() error { return ErrInvalidTakedown }
