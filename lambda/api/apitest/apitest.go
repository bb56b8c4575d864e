// Package apitest is the conformance suite of the relay HTTP API: one
// scenario of requests, defined once here, that every host of
// lambda/api's Handler must answer alike. Hosts today: the handler in
// process (the reference, which records the transcript), the api and ops
// Lambda functions under the Runtime Interface Emulator (lambda/rietest),
// and `relay serve` as a separate process (serve_test.go here).
//
// Each step's answer is reduced to an Outcome: the status, the error code,
// the headers a client acts on (content-type, allow, retry-after) and the
// shape of the JSON body (its keys and value types, not its values, which
// hold times and host-specific names). Run compares every Outcome with
// testdata/transcript.json, so two hosts that differ in any of them
// cannot both pass; steps also check the values that carry the API's
// promises (an idempotent replay answers the first seqs, a stale skip
// names the actual first seq, ...).
//
// The scenario depends on delivery: hosts whose alarms the test runs (the
// fire function, an in-process RelayHandler) run them in Settle; hosts
// with their own alarm clock do nothing there, and the steps that wait for
// delivery poll until it is visible through the API.
//
// Regenerate the transcript after an intended change of the API with
// `go test ./lambda/api/apitest -run TestInProcess -update`, and review
// the diff: every host must then produce it.
package apitest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// Role is who sends a request: the host maps it to its own credentials
// (an IAM caller on the producer or operator function URL, a bearer token
// or certificate of that role for relay serve).
type Role string

// Roles.
const (
	Producer Role = "producer"
	Operator Role = "operator"
)

// Request is one HTTP request of the scenario. Path is raw (percent
// encoded); Query is the raw query string; header names are lower case.
type Request struct {
	Role    Role
	Method  string
	Path    string
	Query   string
	Headers map[string]string
	Body    []byte
}

// Response is what the host answered. Header names must be lower case.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Host serves the API under test, on a store that starts empty.
type Host interface {
	// Do sends req and returns the answer; a transport failure fails t.
	Do(t testing.TB, req Request) Response
	// Settle runs the source's alarms until its outbox is cleared, on
	// hosts whose alarms the test drives; other hosts return at once.
	Settle(t testing.TB, source string)
}

// Outcome is the host-independent summary of a response that hosts must
// agree on.
type Outcome struct {
	Step    string            `json:"step"`
	Status  int               `json:"status"`
	Code    string            `json:"code,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Shape   string            `json:"shape"`

	body string // for messages
}

// comparedHeaders are the response headers a client acts on.
var comparedHeaders = []string{"content-type", "allow", "retry-after"}

// Summarize reduces a response to its Outcome.
func Summarize(step string, resp Response) Outcome {
	o := Outcome{Step: step, Status: resp.Status, Shape: Shape(resp.Body)}
	for _, h := range comparedHeaders {
		if v, ok := resp.Headers[h]; ok {
			if o.Headers == nil {
				o.Headers = map[string]string{}
			}
			o.Headers[h] = v
		}
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(resp.Body, &e) == nil {
		o.Code = e.Error.Code
	}
	return o
}

// Shape describes a JSON document's structure: objects as their sorted
// keys with each value's shape, arrays as the distinct shapes of their
// elements, scalars as their type. A body that is not JSON is "invalid".
func Shape(body []byte) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		return "invalid"
	}
	return shape(v)
}

func shape(v any) string {
	switch v := v.(type) {
	case map[string]any:
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s:%s", k, shape(v[k]))
		}
		b.WriteByte('}')
		return b.String()
	case []any:
		var elems []string
		for _, e := range v {
			if s := shape(e); !slices.Contains(elems, s) {
				elems = append(elems, s)
			}
		}
		return "[" + strings.Join(elems, "|") + "]"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

//go:embed testdata/transcript.json
var transcriptJSON []byte

// Transcript is the recorded Outcome of every step, from the reference
// host.
func Transcript() ([]Outcome, error) {
	var out []Outcome
	if err := json.Unmarshal(transcriptJSON, &out); err != nil {
		return nil, fmt.Errorf("apitest: testdata/transcript.json: %w", err)
	}
	return out, nil
}

// Run plays the scenario against host and, unless record is set (the
// reference host recording a new transcript), reports every difference
// from the transcript as an error. It returns the Outcomes.
func Run(t *testing.T, host Host, record bool) []Outcome {
	t.Helper()
	got := Play(t, host)
	if record {
		return got
	}
	want, err := Transcript()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range Diff(want, got) {
		t.Error(d)
	}
	return got
}

// Play sends every step of the scenario to host, checks the values each
// step checks, and returns the Outcomes without comparing them.
func Play(t *testing.T, host Host) []Outcome {
	t.Helper()
	s := &run{t: t, host: host, answers: map[string]Response{}}
	var got []Outcome
	for _, st := range Scenario() {
		resp := s.step(st)
		o := Summarize(st.Name, resp)
		o.body = string(resp.Body)
		got = append(got, o)
	}
	return got
}

// Diff lists how got differs from want, step by step (nil: no
// difference).
func Diff(want, got []Outcome) []string {
	var out []string
	if len(want) != len(got) {
		out = append(out, fmt.Sprintf("%d steps, the transcript has %d: regenerate it (-update) after changing the scenario", len(got), len(want)))
	}
	byStep := map[string]Outcome{}
	for _, o := range want {
		byStep[o.Step] = o
	}
	for _, o := range got {
		w, ok := byStep[o.Step]
		if !ok {
			out = append(out, fmt.Sprintf("step %s: not in the transcript (regenerate it with -update)", o.Step))
			continue
		}
		if d := compare(w, o); d != "" {
			out = append(out, fmt.Sprintf("step %s differs from the reference host: %s\nbody: %s", o.Step, d, o.body))
		}
	}
	return out
}

// compare lists how got differs from want ("" when it does not).
func compare(want, got Outcome) string {
	var d []string
	if want.Status != got.Status {
		d = append(d, fmt.Sprintf("status %d, want %d", got.Status, want.Status))
	}
	if want.Code != got.Code {
		d = append(d, fmt.Sprintf("error code %q, want %q", got.Code, want.Code))
	}
	if !maps.Equal(want.Headers, got.Headers) {
		d = append(d, fmt.Sprintf("headers %v, want %v", got.Headers, want.Headers))
	}
	if want.Shape != got.Shape {
		d = append(d, fmt.Sprintf("shape\n  %s\nwant\n  %s", got.Shape, want.Shape))
	}
	return strings.Join(d, "; ")
}

type run struct {
	t       *testing.T
	host    Host
	answers map[string]Response
}

// awaitTimeout bounds how long a step waits for a host's own alarm clock
// to deliver (it is another process: nothing to wait on but its answers).
const awaitTimeout = 30 * time.Second

func (s *run) step(st Step) Response {
	s.t.Helper()
	if st.Settle != "" {
		s.host.Settle(s.t, st.Settle)
	}
	deadline := time.Now().Add(awaitTimeout)
	for {
		resp := s.host.Do(s.t, st.Req)
		// 503 source_busy: a host's own alarm clock ran a fire longer
		// than the handler's BusyWait; the API tells clients to retry
		// after retry-after, and so does the scenario (the reference
		// runs no fire concurrently, so its transcript never has one).
		busy := resp.Status == 503 && bytes.Contains(resp.Body, []byte(`"source_busy"`))
		if !busy && (st.Until == nil || (resp.Status == 200 && st.Until(resp.Body))) {
			s.answers[st.Name] = resp
			if st.Check != nil {
				if err := st.Check(resp.Body, s.answers); err != nil {
					s.t.Errorf("step %s (%s %s): %v\nbody: %s", st.Name, st.Req.Method, st.Req.Path, err, resp.Body)
				}
			}
			return resp
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("step %s (%s %s?%s): still %d %s after %v", st.Name, st.Req.Method, st.Req.Path, st.Req.Query, resp.Status, resp.Body, awaitTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
