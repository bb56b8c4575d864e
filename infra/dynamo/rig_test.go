package dynamo_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/relaycore"
)

// The fault tests (fault_test.go: TransactWriteItems, getmany_test.go:
// BatchGetItem) run a real store on an in-process endpoint with a
// fault-injecting transport around the real one, through the same rig.

// rigTable is the table every rig's store uses.
const rigTable = "faults"

// rig is a store whose requests go through rt, with a fixed jitter, a
// recording sleep and numbered tokens (token-0001, ...), so back-offs and
// tokens are exact.
type rig[RT http.RoundTripper] struct {
	store  *dynamo.Store
	rt     RT
	ep     *dynamoemu.Endpoint
	sleeps *sleeps
}

// newRig starts an endpoint with table rigTable and a store on it through
// rt that tries each request at most maxAttempts times, backing off from
// 10ms doubling to at most 40ms.
func newRig[RT http.RoundTripper](t *testing.T, rt RT, maxAttempts int) *rig[RT] {
	t.Helper()
	ep := dynamotest.Start(t)
	client := ep.Client(rt)
	if err := dynamo.CreateTable(t.Context(), client, rigTable); err != nil {
		t.Fatal(err)
	}
	sl := &sleeps{}
	var n atomic.Int64 // NewToken must be safe for concurrent use
	store := dynamo.New(client, rigTable, dynamo.Options{
		Retry:    dynamo.RetryPolicy{MaxAttempts: maxAttempts, Base: 10 * time.Millisecond, Max: 40 * time.Millisecond},
		Jitter:   func() float64 { return 0.5 },
		Sleep:    sl.sleep,
		NewToken: func() string { return fmt.Sprintf("token-%04d", n.Add(1)) },
	})
	return &rig[RT]{store: store, rt: rt, ep: ep, sleeps: sl}
}

// fill writes n keys t/0000.. with value "v<i>" in batches of 50.
func (r *rig[RT]) fill(t *testing.T, n int) []string {
	t.Helper()
	var keys []string
	var b relaycore.Batch
	for i := range n {
		k := fmt.Sprintf("t/%04d", i)
		keys = append(keys, k)
		b.Writes = append(b.Writes, relaycore.Write{Key: k, Value: fmt.Appendf(nil, "v%d", i)})
		if len(b.Writes) == 50 || i == n-1 {
			if err := r.store.Apply(t.Context(), "p", b); err != nil {
				t.Fatal(err)
			}
			b.Writes = nil
		}
	}
	return keys
}

// sleeps records the store's back-offs instead of waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// readBody returns the body of r, an API request of operation op (e.g.
// "BatchGetItem"), and leaves it in r to be sent on; ok is false for any
// other operation, whose body it leaves unread.
func readBody(r *http.Request, op string) (body []byte, ok bool, err error) {
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), "."+op) {
		return nil, false, nil
	}
	body, err = io.ReadAll(r.Body)
	if err != nil {
		return nil, true, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true, nil
}

// internalError is the body of DynamoDB's 500 answer.
const internalError = `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}`

// apiError is an answer the server never gave: status with a DynamoDB
// error body.
func apiError(r *http.Request, status int, body string) *http.Response {
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: r,
	}
}
