// Package api is the API function's handler: a Lambda function URL
// (payload format 2.0, AuthType AWS_IAM) through which producers not
// written in Go enqueue relay rows and anyone allowed to invoke the URL
// reads delivery state.
//
// Routes (docs/deploy.md, "API"):
//
//	POST /v1/sources/{id}/rows                    enqueue rows → seqs
//	GET  /v1/sources/{id}/delivered-through?seq=N RelayDeliveredThrough
//	GET  /v1/sources/{id}/watermark               RelayWatermark
//	GET  /v1/sources/{id}/state                   SourceRelayState
//
// An Idempotency-Key request header on POST .../rows makes the enqueue
// idempotent: a retry with the same key and body returns the first
// request's seqs with "replayed": true and writes nothing.
//
// {id} is one path segment, percent-decoded. Responses are JSON; errors
// are {"error":{"code":"...","message":"..."}} with a 4xx status for
// anything the caller can fix and 5xx otherwise.
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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
)

// Defaults for Handler's limits.
const (
	// DefaultMaxBodyBytes bounds a request body (after base64 decoding).
	// Function URLs accept 6 MB; 1 MiB keeps one request within a few
	// DynamoDB transactions and well inside the function's timeout.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxRows bounds the rows of one enqueue request.
	DefaultMaxRows = 1000
	// commitMargin is kept between the enqueue deadline and the
	// invocation's deadline, so the handler can still answer with the
	// seqs that committed.
	commitMargin = 2 * time.Second
)

// Handler serves function URL requests. Source is required; a nil Clock
// is the system clock, a nil Logger discards. Enqueue configures
// CommitRelayRows (its Kicker arms the fast-path alarm; its TargetCaps
// should be the target store's limits so undeliverable rows are refused
// at enqueue).
type Handler struct {
	Source  relaycore.Store
	Clock   relaycore.Clock
	Enqueue relaycore.EnqueueConfig
	Logger  *slog.Logger

	MaxBodyBytes, MaxRows int
}

func (h *Handler) clock() relaycore.Clock {
	if h.Clock == nil {
		return relaycore.SystemClock{}
	}
	return h.Clock
}

// Handle serves one request.
func (h *Handler) Handle(ctx context.Context, payload json.RawMessage) (events.LambdaFunctionURLResponse, error) {
	log := event.Logger(ctx, h.Logger)
	req, err := ParseRequest(payload)
	if err != nil {
		log.Warn("api event refused", "err", err)
		return events.LambdaFunctionURLResponse{}, err
	}
	log = log.With("method", req.RequestContext.HTTP.Method, "path", req.RawPath)
	if a := req.RequestContext.Authorizer; a != nil && a.IAM != nil {
		log = log.With("caller", a.IAM.UserARN)
	}
	resp := h.serve(ctx, req, log)
	level := slog.LevelInfo
	if resp.StatusCode >= 500 {
		level = slog.LevelError
	} else if resp.StatusCode >= 400 {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "api request", "status", resp.StatusCode)
	return resp, nil
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

// apiError is a response the handler chose; code is a stable
// machine-readable word, message is for people.
type apiError struct {
	status  int
	code    string
	message string
	row     *int
	seqs    []uint64
	allow   string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func fail(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

func (h *Handler) serve(ctx context.Context, req events.LambdaFunctionURLRequest, log *slog.Logger) events.LambdaFunctionURLResponse {
	if a := req.RequestContext.Authorizer; a == nil || a.IAM == nil || a.IAM.UserARN == "" {
		return errorResponse(fail(403, "forbidden", "no IAM caller in the request context: the function URL must use AuthType AWS_IAM"))
	}
	rt, aerr := route(req)
	if aerr != nil {
		return errorResponse(aerr)
	}
	var (
		body any
		err  error
	)
	switch rt.action {
	case actionRows:
		body, err = h.enqueue(ctx, rt.source, req, log)
	case actionDeliveredThrough:
		body, err = h.deliveredThrough(ctx, rt.source, req)
	case actionWatermark:
		body, err = h.watermark(ctx, rt.source, req)
	case actionState:
		body, err = h.state(ctx, rt.source, req)
	}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			log.Error("api: storage error", "err", err)
			ae = fail(500, "internal", "%v", err)
		}
		return errorResponse(ae)
	}
	return jsonResponse(200, body)
}

func jsonResponse(status int, body any) events.LambdaFunctionURLResponse {
	data, err := json.Marshal(body)
	if err != nil {
		// Only the handler's own plain structs are encoded.
		status, data = 500, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	return events.LambdaFunctionURLResponse{
		StatusCode: status,
		Headers:    map[string]string{"content-type": "application/json"},
		Body:       string(data),
	}
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
	// Seqs, on a failed enqueue, holds the seq of each input row that did
	// commit (0: not committed), so a caller retries only the rest.
	Seqs []uint64 `json:"seqs,omitempty"`
}

// ErrorDetail says what went wrong. Code is stable; Message is not.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Row is the index of the refused row, for code invalid_row.
	Row *int `json:"row,omitempty"`
}

func errorResponse(e *apiError) events.LambdaFunctionURLResponse {
	resp := jsonResponse(e.status, ErrorBody{Error: ErrorDetail{Code: e.code, Message: e.message, Row: e.row}, Seqs: e.seqs})
	if e.allow != "" {
		resp.Headers["allow"] = e.allow
	}
	return resp
}
