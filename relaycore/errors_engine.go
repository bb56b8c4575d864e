package relaycore

import (
	"errors"
	"fmt"
)

// Engine sentinels. Store-level sentinels (ErrMaybeApplied, ErrBatchTooLarge,
// ...) live in errors.go with the storage contract.

// ErrInvalidRow means a relay row was refused before anything was written.
// The concrete error is a *RowError naming the row and the reason.
var ErrInvalidRow = errors.New("invalid relay row")

// ErrLeaseRequired means the source was declared lease-required
// (DeclareLeaseRequired) and the caller supplied no lease. Nothing was written.
var ErrLeaseRequired = errors.New("source requires a lease")

// ErrStaleLease means the caller's lease no longer matches the source's lease
// record (taken over, renewed by someone else, released or expired). The
// operation failed closed: the batch that noticed it was not applied.
var ErrStaleLease = errors.New("stale source lease")

// ErrLeaseHeld means AcquireLease found a live lease of another holder.
var ErrLeaseHeld = errors.New("source lease held by another holder")

// ErrDeadlineExceeded means the clock reached the enqueue deadline (the
// caller's deadline or lease expiry minus the skew margin) before a batch was
// sent. Batches committed before it stay committed (see CommitResult).
var ErrDeadlineExceeded = errors.New("relay enqueue deadline exceeded")

// ErrCorruptRecord means a relay record (os, rs, lease, alarm, rh or a row
// page) could not be decoded. The engine never overwrites what it cannot read.
var ErrCorruptRecord = errors.New("corrupt relay record")

// ErrUnknownPlan means PlanBudget was given a plan name other than free or paid.
var ErrUnknownPlan = errors.New("unknown relay plan")

// ErrCommitUnknown means an enqueue batch's outcome stayed ambiguous after
// re-reading (the store said it may have been applied and the evidence was
// already gone). Its rows may or may not be in the outbox; the caller must
// not assume either.
var ErrCommitUnknown = errors.New("relay enqueue outcome unknown")

// ErrContention means an engine compare-and-set kept losing to other writers
// (CommitRelayRows on os, a fire's checkpoint on rs, an alarm clearing its
// record). What committed before it stays committed; retrying later is safe.
var ErrContention = errors.New("relay compare-and-set lost too many races")

// ErrNoDueIndex means a wrapper (CountingStore) was asked for due entries
// but the store it wraps keeps no due index. Nothing was read.
var ErrNoDueIndex = errors.New("store has no due index")

// RowError names the input row (by index) that enqueue validation refused
// and why. It wraps ErrInvalidRow.
type RowError struct {
	Index  int
	Reason string
}

func (e *RowError) Error() string { return fmt.Sprintf("relay row %d: %s", e.Index, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalidRow) true.
func (e *RowError) Unwrap() error { return ErrInvalidRow }

// ErrInvalidIdempotencyKey means EnqueueConfig.IdempotencyKey is not 1..128
// bytes of [A-Za-z0-9._:-]. Nothing was read or written.
var ErrInvalidIdempotencyKey = errors.New("invalid idempotency key")

// ErrIdempotencyKeyReused means a live idempotency record holds the key for
// different rows (another digest): the request was refused and nothing was
// written. Use a new key for new rows.
var ErrIdempotencyKeyReused = errors.New("idempotency key reused with different rows")

// ErrIdempotentRequestTooLarge means rows sent with an idempotency key do
// not fit one source batch together with the idempotency record (the
// guarantee needs one atomic commit). Nothing was written. On DynamoDB a
// batch holds 100 items and 4 MB; os, alarm and the record take three
// (a lease a fourth), leaving 97 items for the pages and one target record
// per distinct target: with the default 8 KB pages about 760 KB of row data
// (more where it compresses) for a few targets, and at most 48 distinct
// targets. Split larger requests into several keyed requests.
var ErrIdempotentRequestTooLarge = errors.New("idempotent enqueue does not fit one batch")
