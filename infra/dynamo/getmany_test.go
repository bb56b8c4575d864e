package dynamo_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/truora/minidyn/server"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/relaycore"
)

// batchGetRT fails the next BatchGetItem requests with the queued
// responses (they never reach the server) and counts the keys of every
// BatchGetItem it passes on.
type batchGetRT struct {
	next http.RoundTripper

	mu    sync.Mutex
	fails []string // "throttle" or "500"
	keys  []int    // keys per request that reached the server
}

func (f *batchGetRT) RoundTrip(r *http.Request) (*http.Response, error) {
	body, ok, err := readBody(r, "BatchGetItem")
	if !ok {
		return f.next.RoundTrip(r)
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	fail := ""
	if len(f.fails) > 0 {
		fail, f.fails = f.fails[0], f.fails[1:]
	} else {
		f.keys = append(f.keys, bytes.Count(body, []byte(`"k":`)))
	}
	f.mu.Unlock()
	switch fail {
	case "throttle":
		return apiError(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"throughput exceeded"}`), nil
	case "500":
		return apiError(r, 500, internalError), nil
	}
	return f.next.RoundTrip(r)
}

// newBatchRig is a rig whose transport injects batchGetRT's failures.
func newBatchRig(t *testing.T, maxAttempts int) *rig[*batchGetRT] {
	t.Helper()
	return newRig(t, &batchGetRT{next: http.DefaultTransport}, maxAttempts)
}

func wantAll(t *testing.T, m map[string][]byte, keys []string) {
	t.Helper()
	if len(m) != len(keys) {
		t.Fatalf("%d values, want %d", len(m), len(keys))
	}
	for i, k := range keys {
		if string(m[k]) != fmt.Sprintf("v%d", i) {
			t.Fatalf("%s = %q, want v%d", k, m[k], i)
		}
	}
}

// 250 distinct keys (with repeats) go out as three BatchGetItem requests of
// at most 100 distinct keys; empty and unstorable keys are not sent.
func TestGetManySplitsAndDedupes(t *testing.T) {
	r := newBatchRig(t, 3)
	keys := r.fill(t, 250)
	asked := append(append([]string{"", strings.Repeat("x", 2000)}, keys...), keys[:30]...)
	m, err := r.store.GetMany(t.Context(), "p", asked)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, m, keys)
	if got := fmt.Sprint(r.rt.keys); got != "[100 100 50]" {
		t.Fatalf("keys per BatchGetItem %s, want [100 100 50]", got)
	}
	if st := r.store.Stats(); st.BatchGetItem != 3 || st.GetItem != 0 || st.Retries != 0 {
		t.Fatalf("stats %+v", st)
	}
	if m, err := r.store.GetMany(t.Context(), "p", []string{"", ""}); err != nil || len(m) != 0 || r.store.Stats().BatchGetItem != 3 {
		t.Fatalf("get many of unstorable keys = %v, %v, %d requests; want nothing sent", m, err, r.store.Stats().BatchGetItem)
	}
}

// Throttling and a 5xx are retried with the read back-off, as for Get.
func TestGetManyRetriesThrottlingAnd5xx(t *testing.T) {
	r := newBatchRig(t, 3)
	keys := r.fill(t, 5)
	r.rt.fails = []string{"throttle", "500"}
	m, err := r.store.GetMany(t.Context(), "p", keys)
	if err != nil {
		t.Fatalf("get many after a throttle and a 500: %v", err)
	}
	wantAll(t, m, keys)
	st := r.store.Stats()
	if st.BatchGetItem != 3 || st.Retries != 2 || st.Throttled != 1 {
		t.Fatalf("stats %+v", st)
	}
	if got, want := fmt.Sprint(r.sleeps.all()), fmt.Sprint([]time.Duration{7500 * time.Microsecond, 15 * time.Millisecond}); got != want {
		t.Fatalf("back-offs %s, want %s", got, want)
	}
	r.rt.fails = []string{"throttle", "throttle", "throttle"}
	if _, err := r.store.GetMany(t.Context(), "p", keys); !errors.Is(err, dynamo.ErrRetriesExhausted) {
		t.Fatalf("get many throttled on every attempt = %v, want ErrRetriesExhausted", err)
	}
}

// Keys DynamoDB leaves unprocessed are asked for again after a back-off,
// and only those.
func TestGetManyFollowsUnprocessedKeys(t *testing.T) {
	r := newBatchRig(t, 3)
	keys := r.fill(t, 10)
	leaveUnprocessed(r.ep)
	m, err := r.store.GetMany(t.Context(), "p", append(keys, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, m, keys)
	if got := fmt.Sprint(r.rt.keys); got != "[11 6 1]" {
		t.Fatalf("keys per BatchGetItem %s, want [11 6 1] (only the unprocessed ones again)", got)
	}
	st := r.store.Stats()
	if st.BatchGetItem != 3 || st.Retries != 2 || st.Throttled != 2 {
		t.Fatalf("stats %+v", st)
	}
	// 10 small items and one absent key: 11 reads of 1 unit each.
	if st.ReadUnits != 11 {
		t.Fatalf("read units %v, want 11", st.ReadUnits)
	}
	if got := len(r.sleeps.all()); got != 2 {
		t.Fatalf("%d back-offs, want 2", got)
	}

	// A table that never serves a key: MaxAttempts rounds without
	// progress, then ErrRetriesExhausted.
	r.ep.Mini.EmulateUnprocessedItems(rigTable, func(int, map[string]*server.AttributeValue) bool { return true })
	before := r.store.Stats().BatchGetItem
	if _, err := r.store.GetMany(t.Context(), "p", keys); !errors.Is(err, dynamo.ErrRetriesExhausted) {
		t.Fatalf("get many never served = %v, want ErrRetriesExhausted", err)
	}
	if got := r.store.Stats().BatchGetItem - before; got != 3 {
		t.Fatalf("%d requests for a batch never served, want 3 (MaxAttempts)", got)
	}
}

// Each key of a BatchGetItem is billed like its own GetItem: 1 RCU per
// started 4 KB of the item, and 1 for an absent key.
func TestGetManyReadUnits(t *testing.T) {
	s, _ := newStore(t, dynamo.Options{})
	ctx := t.Context()
	if err := s.Apply(ctx, "p", relaycore.Batch{Writes: []relaycore.Write{
		{Key: "a", Value: []byte("1")},
		{Key: "huge", Value: bytes.Repeat([]byte{2}, 5000)}, // 5007 B -> 2
	}}); err != nil {
		t.Fatal(err)
	}
	r0 := s.Stats().ReadUnits
	if _, err := s.GetMany(ctx, "p", []string{"a", "huge", "absent", "a"}); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().ReadUnits - r0; got != 1+2+1 {
		t.Fatalf("read units %v, want 4", got)
	}
}

// leaveUnprocessed makes the endpoint leave keys of batch requests
// unprocessed, as DynamoDB does when throttled: the first round every
// other key, the second round the first key, none after.
func leaveUnprocessed(ep *dynamoemu.Endpoint) {
	var rounds atomic.Int64
	ep.Mini.EmulateUnprocessedItems(rigTable, func(n int, _ map[string]*server.AttributeValue) bool {
		if n == 0 {
			rounds.Add(1)
		}
		switch rounds.Load() {
		case 1:
			return n%2 == 0
		case 2:
			return n == 0
		}
		return false
	})
}
