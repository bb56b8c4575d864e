package api

import (
	"context"
	"errors"
	"strings"

	"github.com/relay-dev/relay/relaycore"
)

// An answer is what the API says for an engine error: the status, the
// error code (docs/api.md's error table) and the message, format with the
// error's own text as its one %v (what the caller should do next).
type answer struct {
	err    error // matched with errors.Is
	status int
	code   string
	format string
}

// The engine's errors, mapped to the API's answers: the whole of what the
// API adds to them. The rules behind the errors (which action is allowed in
// which state, what a valid reason or row is) are the engine's. The first
// entry whose err the error wraps answers. One error may answer
// differently by route: ErrContention is source_busy for an operator
// action (nothing changed) and unavailable for an enqueue (seqs says what
// committed).
var (
	operatorAnswers = []answer{
		{relaycore.ErrSkipConflict, 409, "skip_conflict", "%v: read the target again and skip from its first undelivered held row"},
		{relaycore.ErrWrongState, 409, "wrong_state", "%v"},
		{relaycore.ErrUnknownTarget, 404, "unknown_target", "%v: the source never relayed to it"},
		{relaycore.ErrArchiveNotFound, 404, "unknown_archive_entry", "%v"},
		{relaycore.ErrSkipRange, 422, "skip_range", "%v"},
		{relaycore.ErrSkipTooLarge, 422, "skip_too_large", "%v; skip in several requests"},
		{relaycore.ErrInvalidOperatorInput, 400, "bad_request", "%v"},
		{relaycore.ErrSourceBusy, 503, "source_busy", "%v; nothing was changed, retry in a moment"},
		{relaycore.ErrContention, 503, "source_busy", "%v; nothing was changed, retry in a moment"},
		{relaycore.ErrMaybeApplied, 503, "unavailable", maybeAppliedFormat},
		{relaycore.ErrUnavailable, 503, "unavailable", unavailableFormat},
	}
	enqueueAnswers = []answer{
		{relaycore.ErrInvalidRow, 400, "invalid_row", "%v"},
		{relaycore.ErrLeaseRequired, 409, "lease_required", "%v: this source accepts rows only from a lease holder, which the API is not"},
		{relaycore.ErrIdempotencyKeyReused, 409, "idempotency_key_reused", "%v: the Idempotency-Key was used for other rows within its lifetime; use a new key for new rows"},
		{relaycore.ErrIdempotentRequestTooLarge, 413, "too_large", "%v: rows sent with an Idempotency-Key must commit in one batch; send fewer rows per request"},
		{relaycore.ErrInvalidIdempotencyKey, 400, "bad_request", "header Idempotency-Key: %v"},
		{relaycore.ErrBatchTooLarge, 413, "too_large", "%v"},
		{relaycore.ErrValueTooLarge, 413, "too_large", "%v"},
		{relaycore.ErrContention, 503, "unavailable", "%v; " + rowsToken + " were not committed and may be retried"},
		{relaycore.ErrDeadlineExceeded, 503, "unavailable", "%v; " + rowsToken + " were not committed and may be retried"},
		{relaycore.ErrCommitUnknown, 503, "commit_unknown", commitUnknownFormat},
		{relaycore.ErrMaybeApplied, 503, "commit_unknown", commitUnknownFormat},
		{relaycore.ErrUnavailable, 503, "unavailable", "%v; " + rowsToken + " were not committed: retry them after the retry-after seconds"},
		{context.Canceled, 503, "unavailable", "%v; " + canceledNote + "; " + rowsToken + " were not committed"},
	}
)

// canceledNote explains a store call cut short by the request's end: the
// client went away (or the server is stopping), not a broken store, so it
// is a 503 logged at WARN like a store out of reach, never a 500.
const canceledNote = "the request ended before the store answered (its client went away, or the server is stopping)"

// The answers to a store that is out of reach (relaycore.ErrUnavailable:
// a database down, cut off or overloaded) or left a write's outcome
// unknown: 503 with retry-after, not 500, since the same request succeeds
// once the store is back. Any route's error the tables do not match gets
// them too (Handler.serve), reads included.
const (
	unavailableFormat   = "%v; nothing was changed: retry after the retry-after seconds"
	maybeAppliedFormat  = "%v; it may or may not have been applied: read the state again before retrying"
	commitUnknownFormat = "%v; " + rowsToken + " may or may not have been committed: retry them with the same Idempotency-Key header (it commits them at most once); without one a retry may commit them twice"
)

// storeAnswers answer what no route's table matched: a store out of reach
// on a read, or a write left unknown.
var storeAnswers = []answer{
	{relaycore.ErrMaybeApplied, 503, "unavailable", maybeAppliedFormat},
	{relaycore.ErrUnavailable, 503, "unavailable", unavailableFormat},
	{context.Canceled, 503, "unavailable", "%v; " + canceledNote + "; nothing was changed"},
}

// answerFor is table's answer to err, with the details the typed errors
// carry (a skip conflict's actual first held seq, a refused row's index)
// and a retry-after of one second on a 503; nil when no entry matches.
func answerFor(table []answer, err error) *apiError {
	for _, a := range table {
		if !errors.Is(err, a.err) {
			continue
		}
		e := fail(a.status, a.code, a.format, err)
		e.cause = err
		if sc, ok := errors.AsType[*relaycore.SkipConflictError](err); ok && a.err == relaycore.ErrSkipConflict {
			actual := sc.Actual
			e.actualFirst = &actual
		}
		if re, ok := errors.AsType[*relaycore.RowError](err); ok && a.err == relaycore.ErrInvalidRow {
			e.row = &re.Index
		}
		if a.status == 503 {
			e.retryAfter = "1"
		}
		return e
	}
	return nil
}

// operatorError answers err by operatorAnswers; an *apiError and any other
// error pass through (storage errors: 500).
func operatorError(err error) error {
	if e, ok := errors.AsType[*apiError](err); ok {
		return e
	}
	if e := answerFor(operatorAnswers, err); e != nil {
		return e
	}
	return err
}

// enqueueError answers an enqueue's error by enqueueAnswers (any other is
// 500 internal). Validation errors come before any write; the others may
// follow committed batches, which res.Seqs reports and the answer carries
// (a refused row's answer carries none: nothing was written).
func enqueueError(err error, res relaycore.CommitResult) error {
	e := answerFor(enqueueAnswers, err)
	if e == nil {
		e = fail(500, "internal", "%v", err)
		e.cause = err
	}
	if e.code == "invalid_row" {
		return e
	}
	for _, s := range res.Seqs {
		if s != 0 {
			e.seqs = res.Seqs
			break
		}
	}
	if e.seqs == nil {
		// No row committed, and the body carries no seqs to look in.
		e.message = strings.Replace(e.message, rowsToken, "the request's rows", 1)
	}
	return e
}

// rowsToken names, in an enqueue's 503 messages, the rows a retry is
// about: the ones with seq 0 in the body's seqs when some rows committed;
// enqueueError rewords it when none did (the body has no seqs then).
const rowsToken = "rows with seq 0 in seqs"
