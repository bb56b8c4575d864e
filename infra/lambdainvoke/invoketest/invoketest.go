// Package invoketest is a recording AWS Lambda Invoke endpoint for tests
// and benchmarks: an httptest server on 127.0.0.1 that speaks the Invoke
// wire protocol (POST /2015-03-31/functions/{FunctionName}/invocations,
// X-Amz-Invocation-Type header, the event as the body), so the code under
// test reaches it through the real aws-sdk-go-v2 Lambda client, with
// signing, serialization and error deserialization, from this process or
// from a bootstrap running under the Runtime Interface Emulator.
//
// It models the asynchronous invocation the fire function uses to continue
// a source: the request is checked, recorded, answered 202 Accepted and
// queued on C, where the test decides what "Lambda" does with it (run it
// through the handler or an emulator, drop it, run it twice). Nothing runs
// by itself.
//
// It takes both events the relay sends: a fast kick {"source":"..."}
// (lambdainvoke.Kicker; Hop 0) and a continuation {"source":"...","hop":N}
// with N ≥ 1 (lambdainvoke.Invoker). Requests that break the relay's
// contract (another function, a synchronous invoke, an unsigned request,
// any other event) are answered 400 and reported as test errors when the
// test ends.
package invoketest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/relay-dev/relay/infra/internal/awstest"
)

// QueueLen is C's capacity. A test that lets more continuations pile up
// without reading them has a runaway chain; the endpoint then answers 429
// (TooManyRequestsException, as Lambda does when throttling) and reports
// it.
const QueueLen = 1024

// Invocation is one accepted asynchronous invoke.
type Invocation struct {
	// FunctionName as sent (the fire function's ARN).
	FunctionName string
	// Payload is the event body; Source and Hop are decoded from it.
	Payload []byte
	Source  string
	// Hop is the continuation's hop; 0 for a fast kick.
	Hop int
}

// Stats counts requests.
type Stats struct {
	// Requests counts every Invoke request received; Accepted those
	// answered 202; Failed those answered with an injected failure or a
	// contract violation.
	Requests, Accepted, Failed int
}

// Server is a running recording endpoint.
type Server struct {
	// URL is the endpoint's base URL (http://127.0.0.1:port).
	URL string
	// C receives every accepted invocation, in arrival order.
	C <-chan Invocation

	function string
	ep       *awstest.Server
	queue    chan Invocation
	mu       sync.Mutex
	accepted []Invocation
	stats    Stats
}

// Start runs an endpoint that accepts async invokes of function (an ARN)
// until the test ends; contract violations seen by then fail the test.
func Start(tb testing.TB, function string) *Server {
	tb.Helper()
	q := make(chan Invocation, QueueLen)
	s := &Server{function: function, queue: q, C: q}
	s.ep = awstest.Start(tb, "invoketest", s.serve)
	s.URL = s.ep.URL
	return s
}

// Client returns a Lambda client for the endpoint with static dummy
// credentials and a single attempt per call.
func (s *Server) Client() *lambda.Client {
	return lambda.New(lambda.Options{
		Region:           awstest.Region,
		BaseEndpoint:     aws.String(s.URL),
		Credentials:      awstest.Credentials(),
		RetryMaxAttempts: 1,
		HTTPClient:       s.ep.HTTPClient(),
	})
}

// Fail makes every following request fail with status (e.g. 429 or 500);
// 0 restores normal behaviour.
func (s *Server) Fail(status int) { s.ep.Fail(status) }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Accepted returns every accepted invocation so far, in arrival order
// (whether or not it was taken from C).
func (s *Server) Accepted() []Invocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Invocation(nil), s.accepted...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	inv, problem := s.parse(r)
	if problem != "" {
		s.ep.Violation(problem)
		s.stats.Failed++
		writeError(w, http.StatusBadRequest, "InvalidRequestContentException", problem)
		return
	}
	if fail := s.ep.Failing(); fail != 0 {
		s.stats.Failed++
		typ := "ServiceException"
		if fail == http.StatusTooManyRequests {
			typ = "TooManyRequestsException"
		}
		writeError(w, fail, typ, "injected failure")
		return
	}
	select {
	case s.queue <- inv:
	default:
		s.ep.Violation(fmt.Sprintf("more than %d continuations queued and not taken: runaway chain? (%s hop %d)", QueueLen, inv.Source, inv.Hop))
		s.stats.Failed++
		writeError(w, http.StatusTooManyRequests, "TooManyRequestsException", "queue full")
		return
	}
	s.stats.Accepted++
	s.accepted = append(s.accepted, inv)
	w.WriteHeader(http.StatusAccepted)
}

// parse checks a request against what the relay's continuation must send.
func (s *Server) parse(r *http.Request) (Invocation, string) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/2015-03-31/functions/")
	rawName, ok2 := strings.CutSuffix(rest, "/invocations")
	if r.Method != http.MethodPost || !ok || !ok2 {
		return Invocation{}, fmt.Sprintf("unexpected request %s %s (only Invoke is expected)", r.Method, r.URL.Path)
	}
	name, err := url.PathUnescape(rawName)
	if err != nil || name != s.function {
		return Invocation{}, fmt.Sprintf("invoke of %q: only %q may be invoked", rawName, s.function)
	}
	if q := r.URL.Query().Get("Qualifier"); q != "" {
		return Invocation{}, fmt.Sprintf("invoke with qualifier %q: the fire function is invoked unqualified", q)
	}
	if !awstest.Signed(r) {
		return Invocation{}, "invoke not signed with SigV4"
	}
	if typ := r.Header.Get("X-Amz-Invocation-Type"); typ != "Event" {
		return Invocation{}, fmt.Sprintf("invocation type %q, want Event (a continuation must not wait for the next alarm)", typ)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return Invocation{}, fmt.Sprintf("read body: %v", err)
	}
	var ev struct {
		Source *string `json:"source"`
		Hop    *int    `json:"hop"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return Invocation{}, fmt.Sprintf("event %s: %v", data, err)
	}
	switch {
	case ev.Source == nil || *ev.Source == "":
		return Invocation{}, fmt.Sprintf("event %s: no source", data)
	case ev.Hop == nil:
		return Invocation{FunctionName: name, Payload: data, Source: *ev.Source}, "" // a fast kick
	case *ev.Hop < 1:
		return Invocation{}, fmt.Sprintf("event %s: a continuation carries hop ≥ 1 (a fast kick carries none)", data)
	}
	return Invocation{FunctionName: name, Payload: data, Source: *ev.Source, Hop: *ev.Hop}, ""
}

// writeError answers in Lambda's error shape.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	awstest.WriteError(w, status, typ, map[string]string{"Type": "User", "message": msg})
}
