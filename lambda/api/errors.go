package api

import (
	"errors"

	"github.com/relay-dev/relay/relaycore"
)

// operatorAnswers maps the engine's operator errors to the API's answers:
// status, error code and what the message adds for the caller
// (docs/api.md's error table). The rules themselves (which action is
// allowed in which state, what a valid reason is) are the engine's; this
// table is all the API adds. The first entry whose err the error wraps
// (errors.Is) answers; the message is the error's own text, then hint.
var operatorAnswers = []struct {
	err    error
	status int
	code   string
	hint   string
}{
	{relaycore.ErrSkipConflict, 409, "skip_conflict", ": read the target again and skip from its first undelivered held row"},
	{relaycore.ErrWrongState, 409, "wrong_state", ""},
	{relaycore.ErrUnknownTarget, 404, "unknown_target", ": the source never relayed to it"},
	{relaycore.ErrArchiveNotFound, 404, "unknown_archive_entry", ""},
	{relaycore.ErrSkipRange, 422, "skip_range", ""},
	{relaycore.ErrSkipTooLarge, 422, "skip_too_large", "; skip in several requests"},
	{relaycore.ErrInvalidOperatorInput, 400, "bad_request", ""},
	{relaycore.ErrSourceBusy, 503, "source_busy", "; nothing was changed, retry in a moment"},
	{relaycore.ErrContention, 503, "source_busy", "; nothing was changed, retry in a moment"},
}

// operatorError answers err by operatorAnswers; an *apiError and any other
// error pass through (storage errors: 500). A skip conflict carries the
// actual first held seq, a busy source a retry-after of one second.
func operatorError(err error) error {
	if e, ok := errors.AsType[*apiError](err); ok {
		return e
	}
	for _, a := range operatorAnswers {
		if !errors.Is(err, a.err) {
			continue
		}
		e := fail(a.status, a.code, "%v%s", err, a.hint)
		if sc, ok := errors.AsType[*relaycore.SkipConflictError](err); ok && a.err == relaycore.ErrSkipConflict {
			actual := sc.Actual
			e.actualFirst = &actual
		}
		if a.status == 503 {
			e.retryAfter = "1"
		}
		return e
	}
	return err
}
