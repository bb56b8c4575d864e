package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/relaycore"
)

// fault is what faultRT does to one TransactWriteItems request.
type fault int

const (
	pass     fault = iota
	throttle       // 400 ThrottlingException; the request never reaches the server
	conflict       // 400 TransactionCanceledException, reason TransactionConflict
	fail500        // 500 InternalServerError; never reaches the server
	drop           // reaches the server and commits; the response is lost
	denied         // 400 AccessDeniedException; never reaches the table
	invalid        // 400 ValidationException; never reaches the table
)

// faultRT wraps the real transport and injects faults into successive
// requests of operation op (TransactWriteItems when empty), recording each
// request's token and body.
type faultRT struct {
	next http.RoundTripper
	op   string

	mu     sync.Mutex
	faults []fault
	tokens []string
	bodies [][]byte
}

func (f *faultRT) then(fs ...fault) {
	f.mu.Lock()
	f.faults = append(f.faults, fs...)
	f.mu.Unlock()
}

func (f *faultRT) sent() ([]string, [][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...), append([][]byte(nil), f.bodies...)
}

func (f *faultRT) RoundTrip(r *http.Request) (*http.Response, error) {
	op := f.op
	if op == "" {
		op = "TransactWriteItems"
	}
	body, ok, err := readBody(r, op)
	if !ok {
		return f.next.RoundTrip(r)
	}
	if err != nil {
		return nil, err
	}
	var in struct {
		ClientRequestToken string
		TransactItems      []json.RawMessage
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("fault transport: %w", err)
	}
	f.mu.Lock()
	f.tokens = append(f.tokens, in.ClientRequestToken)
	f.bodies = append(f.bodies, dynamoemu.CanonicalJSON(body))
	ft := pass
	if len(f.faults) > 0 {
		ft, f.faults = f.faults[0], f.faults[1:]
	}
	f.mu.Unlock()
	switch ft {
	case throttle:
		return apiError(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}`), nil
	case conflict:
		if op != "TransactWriteItems" {
			return apiError(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}`), nil
		}
		reasons := make([]string, len(in.TransactItems))
		for i := range reasons {
			reasons[i] = `{"Code":"None"}`
		}
		reasons[0] = `{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}`
		return apiError(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict]","CancellationReasons":[`+strings.Join(reasons, ",")+`]}`), nil
	case fail500:
		return apiError(r, 500, internalError), nil
	case denied:
		return apiError(r, 400, `{"__type":"com.amazon.coral.service#AccessDeniedException","message":"User is not authorized to perform: dynamodb:`+op+`"}`), nil
	case invalid:
		return apiError(r, 400, `{"__type":"com.amazon.coral.validate#ValidationException","message":"Transaction request cannot include multiple operations on one item"}`), nil
	case drop:
		resp, err := f.next.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errors.New("read tcp: connection reset by peer (injected after the server committed)")
	}
	return f.next.RoundTrip(r)
}

// newFaultRig is a rig whose transport injects faultRT's faults into
// TransactWriteItems requests.
func newFaultRig(t *testing.T, maxAttempts int) *rig[*faultRT] {
	t.Helper()
	return newRig(t, &faultRT{next: http.DefaultTransport}, maxAttempts)
}

// newOpFaultRig is a rig whose transport injects faultRT's faults into
// requests of operation op (PutItem, DeleteItem, GetItem).
func newOpFaultRig(t *testing.T, op string, maxAttempts int) *rig[*faultRT] {
	t.Helper()
	return newRig(t, &faultRT{next: http.DefaultTransport, op: op}, maxAttempts)
}

// casBatch advances counter "n" from `from` to from+1, guarded, and logs a
// marker only a single application can create.
func casBatch(from int) relaycore.Batch {
	pc := relaycore.Precondition{Key: "n", Absent: true}
	if from > 0 {
		pc = relaycore.Precondition{Key: "n", Value: []byte(fmt.Sprint(from))}
	}
	return relaycore.Batch{
		Preconditions: []relaycore.Precondition{pc},
		Writes: []relaycore.Write{
			{Key: "n", Value: []byte(fmt.Sprint(from + 1))},
			{Key: fmt.Sprintf("log/%03d", from+1), Value: []byte("x")},
		},
	}
}

func wantCounter(t *testing.T, s *dynamo.Store, want int) {
	t.Helper()
	v, ok, err := s.Get(t.Context(), "p", "n")
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	if ok {
		fmt.Sscan(string(v), &got)
	}
	if got != want {
		t.Fatalf("counter = %d, want %d", got, want)
	}
	page, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{Start: "log/", End: "log0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != want {
		t.Fatalf("%d log markers, want %d (one per application)", len(page.Items), want)
	}
}

func TestThrottlingIsRetriedWithTheSameToken(t *testing.T) {
	r := newFaultRig(t, 6)
	r.rt.then(throttle, conflict, throttle)
	if err := r.store.Apply(t.Context(), "p", casBatch(0)); err != nil {
		t.Fatalf("apply after three transient refusals: %v", err)
	}
	wantCounter(t, r.store, 1)
	tokens, bodies := r.rt.sent()
	if len(tokens) != 4 {
		t.Fatalf("%d TransactWriteItems requests, want 4", len(tokens))
	}
	for i := range tokens {
		if tokens[i] != "token-0001" || !bytes.Equal(bodies[i], bodies[0]) {
			t.Fatalf("attempt %d sent token %q (body equal: %v); every retry must resend the same request", i+1, tokens[i], bytes.Equal(bodies[i], bodies[0]))
		}
	}
	// Base 10ms doubling, capped at 40ms; half fixed plus half scaled by
	// the jitter 0.5.
	want := []time.Duration{7500 * time.Microsecond, 15 * time.Millisecond, 30 * time.Millisecond}
	if got := r.sleeps.all(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("back-offs %v, want %v", got, want)
	}
	st := r.store.Stats()
	if st.TransactWriteItems != 4 || st.Throttled != 3 || st.Retries != 3 || st.Transactions != 1 || st.Ambiguous != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A second Apply draws a new token.
	if err := r.store.Apply(t.Context(), "p", casBatch(1)); err != nil {
		t.Fatal(err)
	}
	if tokens, _ := r.rt.sent(); tokens[len(tokens)-1] != "token-0002" {
		t.Fatalf("second apply used token %q", tokens[len(tokens)-1])
	}
}

func TestThrottlingExhaustedIsSurelyNotApplied(t *testing.T) {
	r := newFaultRig(t, 3)
	r.rt.then(throttle, conflict, throttle)
	err := r.store.Apply(t.Context(), "p", casBatch(0))
	if !errors.Is(err, dynamo.ErrRetriesExhausted) {
		t.Fatalf("apply = %v, want ErrRetriesExhausted", err)
	}
	if relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v reports maybe-applied; every attempt was refused", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply = %v is a condition failure", err)
	}
	wantCounter(t, r.store, 0)
	if got := len(r.sleeps.all()); got != 2 {
		t.Fatalf("%d back-offs for 3 attempts, want 2", got)
	}
}

// A response lost after the server committed: the retry carries the same
// ClientRequestToken and the endpoint (like DynamoDB) answers it without
// applying the batch again.
func TestLostResponseResolvedByToken(t *testing.T) {
	r := newFaultRig(t, 4)
	r.rt.then(drop)
	if err := r.store.Apply(t.Context(), "p", casBatch(0)); err != nil {
		t.Fatalf("apply with a lost first response: %v", err)
	}
	wantCounter(t, r.store, 1)
	if n := r.ep.Tokens(); n != 1 {
		t.Fatalf("endpoint committed %d tokens, want 1", n)
	}
	if st := r.store.Stats(); st.Ambiguous != 1 || st.Transactions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// With no attempts left the outcome is unknown, and the store says so.
func TestLostResponseWithoutRetryMayBeApplied(t *testing.T) {
	r := newFaultRig(t, 1)
	r.rt.then(drop)
	err := r.store.Apply(t.Context(), "p", casBatch(0))
	if !relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v, want a maybe-applied error", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply = %v claims a condition failure", err)
	}
	wantCounter(t, r.store, 1) // it was in fact applied
}

// minidyn ignores ClientRequestToken, so there the retry runs again and the
// guard fails on the first attempt's own write. That must not be reported
// as "precondition failed" (surely not applied): it is maybe-applied.
func TestLostResponseWithTokenIgnoringEndpoint(t *testing.T) {
	r := newFaultRig(t, 4)
	r.ep.IgnoreTokens()
	r.rt.then(drop)
	err := r.store.Apply(t.Context(), "p", casBatch(0))
	if !relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v, want maybe-applied", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply = %v is a ConditionFailedError, which promises the batch was not applied", err)
	}
	wantCounter(t, r.store, 1)
}

// A 5xx that in fact applied nothing: the retry with the same token applies
// the batch once.
func TestInternalServerErrorRetried(t *testing.T) {
	r := newFaultRig(t, 4)
	r.rt.then(fail500, fail500)
	if err := r.store.Apply(t.Context(), "p", casBatch(0)); err != nil {
		t.Fatalf("apply after two 500s: %v", err)
	}
	wantCounter(t, r.store, 1)
	r.rt.then(fail500, fail500, fail500, fail500)
	err := r.store.Apply(t.Context(), "p", casBatch(1))
	if !relaycore.MayBeApplied(err) {
		t.Fatalf("apply after only 500s = %v, want maybe-applied", err)
	}
}

// A real condition failure after a retry that never reached the server is
// still a plain condition failure.
func TestConditionFailureAfterThrottle(t *testing.T) {
	r := newFaultRig(t, 4)
	r.rt.then(throttle)
	b := casBatch(5) // counter is absent, so "n == 5" is false
	err := r.store.Apply(t.Context(), "p", b)
	if i, ok := relaycore.FailedPrecondition(err); !ok || i != 0 {
		t.Fatalf("apply = %v, want precondition 0 failed", err)
	}
	if relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v reports maybe-applied", err)
	}
}

func TestCancelledDuringBackoff(t *testing.T) {
	r := newFaultRig(t, 5)
	ctx, cancel := context.WithCancel(t.Context())
	r.rt.then(throttle)
	store := dynamo.New(r.ep.Client(r.rt), rigTable, dynamo.Options{
		Sleep: func(context.Context, time.Duration) error { cancel(); return context.Canceled },
	})
	err := store.Apply(ctx, "p", casBatch(0))
	if !errors.Is(err, context.Canceled) || relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v, want context.Canceled, surely not applied", err)
	}
	wantCounter(t, r.store, 0)
}

// Capabilities are enforced before anything is sent: minidyn would accept
// 101 actions.
func TestLimitsCheckedBeforeSending(t *testing.T) {
	r := newFaultRig(t, 1)
	var b relaycore.Batch
	for i := range 101 {
		b.Writes = append(b.Writes, relaycore.Write{Key: fmt.Sprintf("k%03d", i), Value: []byte("v")})
	}
	if err := r.store.Apply(t.Context(), "p", b); !errors.Is(err, relaycore.ErrBatchTooLarge) {
		t.Fatalf("apply of 101 items = %v, want ErrBatchTooLarge", err)
	}
	long := relaycore.Batch{Writes: []relaycore.Write{{Key: strings.Repeat("é", 300), Value: []byte("v")}}}
	if err := r.store.Apply(t.Context(), "p", long); !errors.Is(err, relaycore.ErrInvalidBatch) {
		t.Fatalf("apply of a key of 1200 encoded bytes = %v, want ErrInvalidBatch", err)
	}
	if tokens, _ := r.rt.sent(); len(tokens) != 0 {
		t.Fatalf("%d requests sent for refused batches", len(tokens))
	}
}
