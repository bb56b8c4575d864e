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
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/relay-dev/relay/infra/internal/awstest"
	"github.com/relay-dev/relay/internal/awsproto"
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

// parse checks a request against what the relay's kicks and
// continuations must send (awsproto.ParseInvoke).
func (s *Server) parse(r *http.Request) (Invocation, string) {
	data, ev, problem := awsproto.ParseInvoke(r, s.function)
	if problem != "" {
		return Invocation{}, problem
	}
	return Invocation{FunctionName: s.function, Payload: data, Source: ev.Source, Hop: ev.Hop}, ""
}

// writeError answers in Lambda's error shape.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	awsproto.WriteError(w, status, typ, map[string]string{"Type": "User", "message": msg})
}
