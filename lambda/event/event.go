// Package event decodes and validates the payloads the relay's Lambda
// functions receive. Every function refuses what it does not understand
// before touching storage: an unknown field, a missing source or trailing
// data is an *InvalidEventError, and the function writes nothing.
//
// Why so strict: the fire function is invoked asynchronously by
// EventBridge Scheduler and retried, then dead-lettered, on error. A
// silently accepted malformed event (say, "sourc" for "source") would look
// like a successful no-op and hide a misconfigured schedule; a refused one
// lands in the dead-letter queue where an operator sees it.
package event

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/relay-dev/relay/internal/strictjson"
	"github.com/relay-dev/relay/relaycore"
)

// ErrInvalidEvent is wrapped by every *InvalidEventError: the event was
// refused before anything was read or written. Retrying the same event
// fails the same way.
var ErrInvalidEvent = errors.New("invalid event")

// InvalidEventError names the function whose event was refused and why.
// Handlers return it unwrapped, so the Lambda runtime reports errorType
// "InvalidEventError" (aws-lambda-go names the error's type).
type InvalidEventError struct {
	Function string
	Reason   string
}

func (e *InvalidEventError) Error() string {
	return fmt.Sprintf("invalid %s event: %s", e.Function, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidEvent) true.
func (e *InvalidEventError) Unwrap() error { return ErrInvalidEvent }

// MaxPayloadBytes bounds a fire or sweep event. Both are a few dozen bytes
// in practice; the bound keeps a runaway payload from being parsed at all.
const MaxPayloadBytes = 4096

// DecodeStrict decodes one JSON object from payload into v, refusing
// unknown fields, trailing data, null and oversized payloads. function
// names the caller in the error.
func DecodeStrict(function string, payload []byte, v any) error {
	if len(payload) > MaxPayloadBytes {
		return &InvalidEventError{function, fmt.Sprintf("payload is %d bytes, limit %d", len(payload), MaxPayloadBytes)}
	}
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return &InvalidEventError{function, "payload is not a JSON object"}
	}
	if err := strictjson.Check(trimmed, v); err != nil {
		return &InvalidEventError{function, err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &InvalidEventError{function, jsonReason(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return &InvalidEventError{function, "trailing data after the JSON object"}
	}
	return nil
}

// AnswerMargin is how long before the invocation's deadline Invoker ends
// the handler's context, given the time left: a quarter of it, at most 3 s
// (room for what runs after the context ends: a failed fire gives its
// claim back within 1 s, then the answer).
// A store or service call that hangs then fails with time left to answer
// (the api a 503, the fire an error Lambda retries, each logged) instead
// of Lambda ending the invocation with "Task timed out" and no answer: an
// enqueue whose rows committed must not look failed for want of time to
// say so.
func AnswerMargin(left time.Duration) time.Duration { return min(3*time.Second, left/4) }

// Invoker adapts handle to the Lambda runtime (lambda.Start) so that
// every payload reaches it as sent, with a context that ends AnswerMargin
// before the invocation's deadline. Given handle itself, aws-lambda-go
// decodes the payload into its argument first and fails an empty or
// non-JSON payload before handle runs, with "unexpected EOF" or a syntax
// error (errorType "errorString", no function, no reason, no log line of
// ours); through Invoker, handle refuses it with an *InvalidEventError
// like any other event it does not understand. The result is encoded as
// the runtime would (JSON, HTML characters not escaped).
func Invoker[R any](handle func(context.Context, json.RawMessage) (R, error)) lambda.Handler {
	return invoker[R](handle)
}

type invoker[R any] func(context.Context, json.RawMessage) (R, error)

func (f invoker[R]) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-AnswerMargin(time.Until(d))))
		defer cancel()
	}
	res, err := f(ctx, payload)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(res); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// jsonReason turns a decoding error into a message that names the field.
func jsonReason(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be a JSON %s", typeErr.Field, typeErr.Type.Kind())
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	return msg
}

// Source validates a source id from outside input by the engine's rule
// (relaycore.SourceIDProblem: 1..MaxPartitionLen bytes of valid UTF-8
// without control characters, not under ReservedPrefix). field names it
// in the error reason.
func Source(field, s string) (relaycore.Partition, error) {
	if reason := relaycore.SourceIDProblem(s); reason != "" {
		return "", fmt.Errorf("%s %s", field, reason)
	}
	return relaycore.Partition(s), nil
}

// Target validates a target name from outside input by the engine's rule
// (relaycore.TargetNameProblem: 1..MaxPartitionLen bytes, any bytes, not
// under ReservedPrefix), the rule the engine itself enqueues by, so a
// target the engine relays to can be named in every route.
func Target(field, s string) (relaycore.Partition, error) {
	if reason := relaycore.TargetNameProblem(s); reason != "" {
		return "", fmt.Errorf("%s %s", field, reason)
	}
	return relaycore.Partition(s), nil
}

// Logger returns l (a discarding logger when nil) annotated with the
// invocation's Lambda request id, when ctx carries one, so log lines can
// be matched to their invocation.
func Logger(ctx context.Context, l *slog.Logger) *slog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		l = l.With("request_id", lc.AwsRequestID)
	}
	return l
}
