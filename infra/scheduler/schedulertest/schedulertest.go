// Package schedulertest is a recording EventBridge Scheduler endpoint for
// tests and benchmarks: an httptest server on 127.0.0.1 that speaks the
// CreateSchedule wire protocol (POST /schedules/{Name}, JSON body), so the
// code under test reaches it through the real aws-sdk-go-v2 client, with
// signing, serialization and error deserialization, from this process or
// from a Lambda bootstrap running under the Runtime Interface Emulator.
//
// It models what the relay depends on: a schedule name is unique among
// pending schedules (a second CreateSchedule gets 409 ConflictException),
// and a one-time schedule with ActionAfterCompletion DELETE disappears
// once it has run, which frees its name. Time does not pass by itself:
// the test decides when schedules "run" (TakeDue, TakeAll) or are lost
// (Lose), and invokes the fire function with their Input.
//
// Requests that break the relay's contract with Scheduler (flexible window
// on, no delete-after-completion, a malformed at() expression, unsigned,
// ...) are answered with ValidationException and reported as test errors
// when the test ends.
package schedulertest

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/relay-dev/relay/infra/internal/awstest"
	"github.com/relay-dev/relay/internal/awsproto"
)

// Schedule is one accepted CreateSchedule request (awsproto's, the
// contract the emulated deployment checks too).
type Schedule = awsproto.Schedule

// Stats counts requests.
type Stats struct {
	// Requests counts every CreateSchedule call received.
	Requests int
	// Created schedules; Conflicts answered 409 (already armed); Failed
	// answered with an injected failure or a validation error.
	Created, Conflicts, Failed int
}

// Server is a running recording endpoint.
type Server struct {
	// URL is the endpoint's base URL (http://127.0.0.1:port).
	URL string

	ep      *awstest.Server
	mu      sync.Mutex
	pending map[string]Schedule
	stats   Stats
}

// Start runs an endpoint until the test ends; protocol violations seen by
// then fail the test.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{pending: map[string]Schedule{}}
	s.ep = awstest.Start(tb, "schedulertest", s.serve)
	s.URL = s.ep.URL
	return s
}

// Client returns a Scheduler client for the endpoint with static dummy
// credentials and a single attempt per call.
func (s *Server) Client() *awsscheduler.Client {
	return awsscheduler.New(awsscheduler.Options{
		Region:           awstest.Region,
		BaseEndpoint:     aws.String(s.URL),
		Credentials:      awstest.Credentials(),
		RetryMaxAttempts: 1,
		HTTPClient:       s.ep.HTTPClient(),
	})
}

// Fail makes every following request fail with status (e.g. 500); 0
// restores normal behaviour.
func (s *Server) Fail(status int) { s.ep.Fail(status) }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Pending returns the armed schedules that have not run, by time then name.
func (s *Server) Pending() []Schedule {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sortedLocked(func(Schedule) bool { return true })
}

// TakeDue removes and returns the pending schedules due at or before t, as
// if they ran (ActionAfterCompletion DELETE frees their names).
func (s *Server) TakeDue(t time.Time) []Schedule {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sortedLocked(func(sc Schedule) bool { return !sc.At.After(t) })
	for _, sc := range out {
		delete(s.pending, sc.Name)
	}
	return out
}

// TakeAll removes and returns every pending schedule, as if they ran.
func (s *Server) TakeAll() []Schedule { return s.TakeDue(time.Unix(1<<40, 0)) }

// Lose drops every pending schedule without running it (a lost kick) and
// returns how many there were.
func (s *Server) Lose() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.pending)
	clear(s.pending)
	return n
}

func (s *Server) sortedLocked(keep func(Schedule) bool) []Schedule {
	var out []Schedule
	for _, sc := range s.pending {
		if keep(sc) {
			out = append(out, sc)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	sc, problem := awsproto.ParseCreateSchedule(r)
	if problem != "" {
		s.ep.Violation(problem)
		s.stats.Failed++
		writeError(w, http.StatusBadRequest, "ValidationException", problem)
		return
	}
	fail := s.ep.Failing()
	switch _, dup := s.pending[sc.Name]; {
	case fail != 0:
		s.stats.Failed++
		writeError(w, fail, "InternalServerException", "injected failure")
	case dup:
		s.stats.Conflicts++
		writeError(w, http.StatusConflict, "ConflictException", "Schedule "+sc.Name+" already exists.")
	default:
		s.stats.Created++
		s.pending[sc.Name] = sc
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"ScheduleArn":"arn:aws:scheduler:us-east-1:123456789012:schedule/%s/%s"}`, sc.Group, sc.Name)
	}
}

// writeError answers in Scheduler's error shape.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	awsproto.WriteError(w, status, typ, map[string]string{"Message": msg})
}
