// Package awstest is what the recording AWS-API endpoints beside infra's
// adapters share (infra/scheduler/schedulertest,
// infra/lambdainvoke/invoketest): an httptest server on 127.0.0.1 that
// lives as long as the test, requests that break the relay's contract
// recorded and reported as test errors when the test ends, an injected
// failure status, and AWS's JSON error responses. Each fake keeps its own
// state, protocol and counters.
package awstest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Region is the region the fakes' clients sign for; any does.
const Region = "us-east-1"

// Credentials are static dummy credentials: the fakes check that a request
// is signed, not who signed it.
func Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider("relay", "relay", "")
}

// Server is a running endpoint.
type Server struct {
	// URL is the endpoint's base URL (http://127.0.0.1:port).
	URL string

	srv        *httptest.Server
	mu         sync.Mutex
	failStatus int
	violations []string
}

// Start runs h on 127.0.0.1 until the test ends; the violations recorded by
// then fail the test, each prefixed with name.
func Start(tb testing.TB, name string, h http.HandlerFunc) *Server {
	tb.Helper()
	s := &Server{srv: httptest.NewServer(h)}
	s.URL = s.srv.URL
	tb.Cleanup(func() {
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, v := range s.violations {
			tb.Errorf("%s: %s", name, v)
		}
	})
	return s
}

// HTTPClient is the client the fake's SDK client sends through.
func (s *Server) HTTPClient() *http.Client { return s.srv.Client() }

// Fail makes every following request fail with status; 0 restores normal
// behaviour.
func (s *Server) Fail(status int) {
	s.mu.Lock()
	s.failStatus = status
	s.mu.Unlock()
}

// Failing returns the status set by Fail.
func (s *Server) Failing() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failStatus
}

// Violation records a request that broke the contract, reported when the
// test ends.
func (s *Server) Violation(problem string) {
	s.mu.Lock()
	s.violations = append(s.violations, problem)
	s.mu.Unlock()
}
