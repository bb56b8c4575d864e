package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/relay-dev/relay/relaycore"
)

// Request is one HTTP request as the handler's core sees it, independent
// of the host: the Lambda function URL adapter (Handle) builds it from the
// event; an HTTP server builds it from net/http's request.
type Request struct {
	Method string
	// Path is the raw (still percent-encoded) path, so a source id may
	// contain an encoded '/'. Query is the raw query string.
	Path, Query string
	// Headers are keyed by lower-case name; a repeated header is joined
	// with commas (as function URLs and net/http's Header.Values do).
	Headers map[string]string
	// Body is the decoded body; the host bounds what it reads (Serve
	// refuses more than MaxBodyBytes).
	Body []byte
	// Caller is the verified identity of the caller (the function URL's
	// IAM user ARN). Empty: unauthenticated, refused with 403. Operator
	// actions record it (shortened) as the actor; nothing in the body can.
	Caller string
}

// Response is the handler's answer: a status, headers (lower-case names)
// and a JSON body.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Serve answers one request. It never panics on input and writes nothing
// for a request it refuses.
func (h *Handler) Serve(ctx context.Context, req Request) Response {
	return h.serve(ctx, req, h.logger())
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

// apiError is a response the handler chose; code is a stable
// machine-readable word, message is for people.
type apiError struct {
	status      int
	code        string
	message     string
	row         *int
	seqs        []uint64
	actualFirst *uint64
	allow       string
	retryAfter  string
	cause       error // the engine's or store's error answered, if any
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func fail(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

func (h *Handler) serve(ctx context.Context, req Request, log *slog.Logger) Response {
	if req.Caller == "" {
		return errorResponse(fail(403, "forbidden", "no verified caller: the function URL must use AuthType AWS_IAM"))
	}
	rt, aerr := h.route(req)
	if aerr != nil {
		return errorResponse(aerr)
	}
	maxBody, _ := h.limits()
	if len(req.Body) > maxBody {
		return errorResponse(fail(413, "too_large", "body is %d bytes, limit %d", len(req.Body), maxBody))
	}
	if rt.route.Method == "GET" && len(req.Body) != 0 {
		return errorResponse(fail(400, "bad_request", "GET requests take no body"))
	}
	body, err := rt.route.serve(h, ctx, rt, req, log)
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			if ae = answerFor(storeAnswers, err); ae == nil {
				ae = fail(500, "internal", "%v", err)
				ae.cause = err
			}
		}
		logAnswer(log, ae)
		return errorResponse(ae)
	}
	if raw, ok := body.(rawBody); ok {
		return Response{Status: 200, Headers: map[string]string{"content-type": raw.contentType}, Body: raw.data}
	}
	return jsonResponse(200, body)
}

// logAnswer logs the errors a person should see: a storage error (500
// internal, at ERROR) and a store out of reach or a write left unknown
// (503 unavailable or commit_unknown, at WARN: the client retries, but a
// database outage must show in the log too). The rest are the caller's.
func logAnswer(log *slog.Logger, ae *apiError) {
	switch {
	case ae.cause == nil:
	case ae.status == 500:
		log.Error("api: storage error", "code", ae.code, "err", ae.cause)
	case errors.Is(ae.cause, relaycore.ErrUnavailable) || errors.Is(ae.cause, relaycore.ErrMaybeApplied) || errors.Is(ae.cause, relaycore.ErrCommitUnknown):
		log.Warn("api: store unavailable", "code", ae.code, "err", ae.cause)
	case errors.Is(ae.cause, context.Canceled):
		log.Warn("api: request ended before the store answered", "code", ae.code, "err", ae.cause)
	}
}

func jsonResponse(status int, body any) Response {
	data, err := json.Marshal(body)
	if err != nil {
		// Only the handler's own plain structs are encoded.
		status, data = 500, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	return Response{Status: status, Headers: map[string]string{"content-type": "application/json"}, Body: data}
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
	// ActualFirst, for code skip_conflict, is the target's first
	// undelivered held seq (0: none is held yet): the expect_first a
	// retried skip should name, after checking it is the row to skip.
	ActualFirst *uint64 `json:"actual_first,omitempty"`
}

func errorResponse(e *apiError) Response {
	resp := jsonResponse(e.status, ErrorBody{Error: ErrorDetail{Code: e.code, Message: e.message, Row: e.row, ActualFirst: e.actualFirst}, Seqs: e.seqs})
	if e.allow != "" {
		resp.Headers["allow"] = e.allow
	}
	if e.retryAfter != "" {
		resp.Headers["retry-after"] = e.retryAfter
	}
	return resp
}

// actorOf turns the caller's identity into relaycore.Actor.By, which holds
// at most relaycore.MaxActorLen bytes: the ARN's "arn:<partition>:sts::" or
// ":iam::" prefix goes (the account id stays), and a name still too long
// keeps its head and tail around "…" (the request log has the full ARN).
func actorOf(caller string) string {
	by := caller
	if rest, ok := strings.CutPrefix(by, "arn:"); ok {
		if _, tail, ok := strings.Cut(rest, ":"); ok { // partition
			for _, svc := range []string{"sts::", "iam::"} {
				if t, ok := strings.CutPrefix(tail, svc); ok {
					by = t
				}
			}
		}
	}
	const maxActor = relaycore.MaxActorLen
	if len(by) <= maxActor {
		return by
	}
	head, tail := by[:30], by[len(by)-(maxActor-30-len("…")):]
	return strings.ToValidUTF8(head, "") + "…" + strings.ToValidUTF8(tail, "")
}
