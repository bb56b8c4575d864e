// Package api is the relay's HTTP API: producers enqueue rows and read
// delivery state; operators list targets, quarantine, release, pause,
// resume and skip them, and list, export and re-enqueue the dead-row
// archive. docs/api.md documents every route and docs/openapi.yaml
// describes them (a test checks it against Routes).
//
// The core (Handler.Serve) takes a host-independent Request and returns a
// Response; Handle adapts a Lambda function URL event (payload format 2.0,
// AuthType AWS_IAM) to it. A Handler serves one RouteSet: producer (enqueue
// and the read routes), operator (the read routes and every operator
// route) or all; a route outside the set answers 404, so a producer's URL
// cannot reach an operator route whatever its IAM policy says.
//
// {source}, {target} and {entry} are one path segment each,
// percent-decoded. Responses are JSON; errors are
// {"error":{"code":"...","message":"..."}} with a 4xx status for anything
// the caller can fix and 5xx otherwise.
//
// Authentication happens at the URL (SigV4, lambda:InvokeFunctionUrl);
// the handler still refuses requests without an IAM caller in the request
// context, so a URL re-created with AuthType NONE fails closed. Requests
// are validated strictly before anything is written: unknown JSON fields,
// unknown query parameters, a wrong content type, oversized bodies and
// invalid rows are all refused with nothing written. An event that is not
// a function URL request at all is refused with an
// *event.InvalidEventError, like the other functions' invalid events.
package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Defaults for Handler's limits.
const (
	// DefaultMaxBodyBytes bounds a request body (after base64 decoding).
	// Function URLs accept 6 MB; 1 MiB keeps one request within a few
	// DynamoDB transactions and well inside the function's timeout.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxRows bounds the rows of one enqueue request.
	DefaultMaxRows = 1000
	// DefaultMaxExportBytes bounds one archive export page's JSON body:
	// Lambda answers at most 6 MB (the body as an escaped JSON string in
	// the invocation's response), so 4 MiB leaves room for the escaping
	// and the envelope.
	DefaultMaxExportBytes = 4 << 20
	// commitMargin is kept between the enqueue deadline and the
	// invocation's deadline, so the handler can still answer with the
	// seqs that committed.
	commitMargin = 2 * time.Second
)

// Handler serves API requests. Source is required; a nil Clock is the
// system clock, a nil Logger discards. Relay takes enqueues and archive
// requeues (RelayHandler.Enqueue: its Kicker arms the fast-path alarm, its
// Target's limits refuse undeliverable rows at enqueue) and runs operator
// actions (it needs both stores: a skip reads the target's rh); the
// operator routes answer 500 without it. Enqueue is deprecated: set, or
// with no Relay, enqueues and requeues go through it as before, with
// Source and Clock. Target is the store of the target partitions, read by the target
// read routes (nil: Relay's Target). Routes selects the routes served
// (zero: RoutesProducer).
type Handler struct {
	Source relaycore.Store
	Target relaycore.Store
	Clock  relaycore.Clock
	// Deprecated: set Relay, wired once with the kicker, logger and both
	// stores; Enqueue stays for one release (CHANGELOG.md).
	Enqueue relaycore.EnqueueConfig
	Relay   *relaycore.RelayHandler
	Routes  RouteSet
	Logger  *slog.Logger

	// Takedowns serves the takedown routes (docs/takedown.md); nil: they
	// answer 500 not_configured.
	Takedowns *takedowns.Owner
	// NodeOf maps the verified caller to its node id for the hold routes
	// (a Lambda deployment's IAM principal -> node mapping); ok false
	// refuses the caller (403). Nil: the caller's name is its node id, as
	// relay serve's principals are (a client certificate's node id).
	NodeOf func(caller string) (node string, ok bool)
	// Committed, when set, is told of each enqueue that committed rows
	// (not a replay), after the commit: relay serve ages its
	// oldest-undelivered gauge from it while its fires cannot run.
	Committed func(source relaycore.Partition, res relaycore.CommitResult)

	MaxBodyBytes, MaxRows int
	// MaxExportBytes bounds the JSON body of one archive export page and
	// of one target items page (default DefaultMaxExportBytes).
	MaxExportBytes int
	// BusyWait is how long an operator action waits for a running fire to
	// release the source's claim before it answers 503 source_busy
	// (default DefaultBusyWait; negative: answer at once). Fires are short,
	// so most actions that meet one succeed a moment later instead of
	// sending the operator back to retry by hand.
	BusyWait time.Duration
}

// DefaultBusyWait is Handler.BusyWait's default.
const DefaultBusyWait = 3 * time.Second

func (h *Handler) maxExportBytes() int {
	if h.MaxExportBytes <= 0 {
		return DefaultMaxExportBytes
	}
	return h.MaxExportBytes
}

func (h *Handler) clock() relaycore.Clock {
	if h.Clock == nil {
		return relaycore.SystemClock{}
	}
	return h.Clock
}

// Handle serves one function URL request: the Lambda adapter of Serve.
func (h *Handler) Handle(ctx context.Context, payload json.RawMessage) (events.LambdaFunctionURLResponse, error) {
	log := event.Logger(ctx, h.Logger)
	ev, err := ParseRequest(payload)
	if err != nil {
		log.Warn("api event refused", "err", err)
		return events.LambdaFunctionURLResponse{}, err
	}
	log = log.With("method", ev.RequestContext.HTTP.Method, "path", ev.RawPath)
	req := Request{Method: ev.RequestContext.HTTP.Method, Path: ev.RawPath, Query: ev.RawQueryString, Headers: ev.Headers, Body: []byte(ev.Body)}
	if a := ev.RequestContext.Authorizer; a != nil && a.IAM != nil {
		req.Caller = a.IAM.UserARN
		log = log.With("caller", a.IAM.UserARN)
	}
	var resp Response
	if ev.IsBase64Encoded {
		resp, req.Body = h.decodeBody(ev.Body)
	}
	if resp.Status == 0 {
		resp = h.serve(ctx, req, log)
	}
	level := slog.LevelInfo
	if resp.Status >= 500 {
		level = slog.LevelError
	} else if resp.Status >= 400 {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "api request", "status", resp.Status)
	return events.LambdaFunctionURLResponse{StatusCode: resp.Status, Headers: resp.Headers, Body: string(resp.Body)}, nil
}

// decodeBody decodes a base64 body, refusing one that would exceed
// MaxBodyBytes before decoding it (a non-zero Response: the refusal).
func (h *Handler) decodeBody(b64 string) (Response, []byte) {
	maxBody, _ := h.limits()
	if base64.StdEncoding.DecodedLen(len(b64)) > maxBody+3 {
		return errorResponse(fail(413, "too_large", "body exceeds %d bytes", maxBody)), nil
	}
	body, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return errorResponse(fail(400, "bad_request", "body is flagged base64 but does not decode: %v", err)), nil
	}
	return Response{}, body
}

// ParseRequest decodes a function URL request and checks it is one: a
// version 2.0 payload with a method and a path. Unknown fields are
// accepted here (AWS adds context fields over time); the request's own
// body is decoded strictly by the route.
func ParseRequest(payload []byte) (events.LambdaFunctionURLRequest, error) {
	var req events.LambdaFunctionURLRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		return req, &event.InvalidEventError{Function: "api", Reason: "not a function URL request: " + err.Error()}
	}
	switch {
	case req.Version != "2.0":
		return req, &event.InvalidEventError{Function: "api", Reason: fmt.Sprintf("not a function URL request: version %q, want \"2.0\"", req.Version)}
	case req.RequestContext.HTTP.Method == "":
		return req, &event.InvalidEventError{Function: "api", Reason: "not a function URL request: no requestContext.http.method"}
	case len(req.RawPath) == 0 || req.RawPath[0] != '/':
		return req, &event.InvalidEventError{Function: "api", Reason: fmt.Sprintf("not a function URL request: rawPath %q", req.RawPath)}
	}
	return req, nil
}
