package dynamo_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/truora/minidyn/server"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/relaycore"
)

// batchWriteRT counts the DeleteRequests of every BatchWriteItem it passes
// on; faults, when set, answers the next BatchWriteItem requests instead
// (they never reach the server) or, for drop, loses the response of one
// that did.
type batchWriteRT struct {
	next http.RoundTripper

	mu     sync.Mutex
	faults []fault
	keys   []int // DeleteRequests per request that reached the server
}

func (f *batchWriteRT) RoundTrip(r *http.Request) (*http.Response, error) {
	body, ok, err := readBody(r, "BatchWriteItem")
	if !ok {
		return f.next.RoundTrip(r)
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	ft := pass
	if len(f.faults) > 0 {
		ft, f.faults = f.faults[0], f.faults[1:]
	}
	if ft == pass || ft == drop {
		f.keys = append(f.keys, bytes.Count(body, []byte(`"DeleteRequest":`)))
	}
	f.mu.Unlock()
	switch ft {
	case throttle:
		return apiError(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"throughput exceeded"}`), nil
	case fail500:
		return apiError(r, 500, internalError), nil
	case drop:
		resp, err := f.next.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		return nil, errors.New("read tcp: connection reset by peer (injected after the server deleted)")
	}
	return f.next.RoundTrip(r)
}

func (f *batchWriteRT) sent() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.keys)
}

// sentSorted is sent in ascending order: the requests of one DeleteLoose
// reach the server in any order.
func (f *batchWriteRT) sentSorted() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(slices.Sorted(slices.Values(f.keys)))
}

// barrierRT holds every BatchWriteItem until want of them are in flight at
// once, then lets them all through: DeleteLoose hangs on it unless it
// sends that many requests at the same time.
type barrierRT struct {
	next http.RoundTripper
	want int

	mu      sync.Mutex
	waiting int
	open    chan struct{}
}

func (b *barrierRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, ok, err := readBody(r, "BatchWriteItem"); !ok || err != nil {
		if err != nil {
			return nil, err
		}
		return b.next.RoundTrip(r)
	}
	b.mu.Lock()
	if b.waiting++; b.waiting == b.want {
		close(b.open)
	}
	b.mu.Unlock()
	select {
	case <-b.open:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return b.next.RoundTrip(r)
}

// A checkpoint's deletes of more than 25 pages wait for one request's
// latency, not one per 25: DeleteLoose sends its BatchWriteItem requests
// at once (up to 4), which the barrier, letting none through before three
// arrive, requires.
func TestDeleteLooseSendsRequestsAtOnce(t *testing.T) {
	r := newRig(t, &barrierRT{next: http.DefaultTransport, want: 3, open: make(chan struct{})}, 3)
	keys := r.fill(t, 70)
	if err := r.store.DeleteLoose(t.Context(), "p", keys[:70]); err != nil {
		t.Fatal(err)
	}
	wantLeft(t, r.store, "p", keys)
}

func newLooseRig(t *testing.T, maxAttempts int) *rig[*batchWriteRT] {
	t.Helper()
	return newRig(t, &batchWriteRT{next: http.DefaultTransport}, maxAttempts)
}

// wantLeft checks that of keys exactly those at the indexes in left are
// still present in partition p.
func wantLeft(t *testing.T, s *dynamo.Store, p relaycore.Partition, keys []string, left ...int) {
	t.Helper()
	page, err := s.Scan(t.Context(), p, relaycore.ScanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, i := range left {
		want = append(want, keys[i])
	}
	for _, it := range page.Items {
		got = append(got, it.Key)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s holds %v, want %v", p, got, want)
	}
}

// 61 distinct keys (one absent, with repeats) go out as three
// BatchWriteItem requests of at most 25 distinct keys; an empty list sends
// nothing.
func TestDeleteLooseSplitsAndDedupes(t *testing.T) {
	r := newLooseRig(t, 3)
	keys := r.fill(t, 62)
	del := append(append(append([]string{}, keys[:60]...), "absent"), keys[:30]...)
	if err := r.store.DeleteLoose(t.Context(), "p", del); err != nil {
		t.Fatal(err)
	}
	wantLeft(t, r.store, "p", keys, 60, 61)
	// The requests go at once, so they reach the server in any order.
	if got := r.rt.sentSorted(); got != "[11 25 25]" {
		t.Fatalf("deletes per BatchWriteItem %s, want 25, 25 and 11", got)
	}
	st := r.store.Stats()
	if st.BatchWriteItem != 3 || st.LooseDeletes != 61 || st.Retries != 0 || st.TransactWriteItems != 2 {
		t.Fatalf("stats %+v", st)
	}
	w0 := st.WriteUnits
	for _, empty := range [][]string{nil, {}} {
		if err := r.store.DeleteLoose(t.Context(), "p", empty); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.store.Stats(); st.BatchWriteItem != 3 || st.WriteUnits != w0 {
		t.Fatalf("an empty list sent %d requests", st.BatchWriteItem-3)
	}
}

// Keys DynamoDB leaves unprocessed are sent again after a back-off, and
// only those; a table that processes nothing for MaxAttempts rounds ends
// in ErrRetriesExhausted, unavailable.
func TestDeleteLooseFollowsUnprocessedItems(t *testing.T) {
	r := newLooseRig(t, 3)
	keys := r.fill(t, 10)
	leaveUnprocessed(r.ep)
	if err := r.store.DeleteLoose(t.Context(), "p", keys[:8]); err != nil {
		t.Fatal(err)
	}
	wantLeft(t, r.store, "p", keys, 8, 9)
	if got := r.rt.sent(); got != "[8 4 1]" {
		t.Fatalf("deletes per BatchWriteItem %s, want [8 4 1]", got)
	}
	if got := fmt.Sprint(r.sleeps.all()); got != "[7.5ms 15ms]" {
		t.Fatalf("back-offs %s", got)
	}
	if st := r.store.Stats(); st.BatchWriteItem != 3 || st.Throttled != 2 || st.Retries != 2 || st.LooseDeletes != 8 {
		t.Fatalf("stats %+v", st)
	}

	r.ep.Mini.EmulateUnprocessedItems(rigTable, func(int, map[string]*server.AttributeValue) bool { return true })
	err := r.store.DeleteLoose(t.Context(), "p", keys[8:])
	if !errors.Is(err, dynamo.ErrRetriesExhausted) || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Fatalf("delete loose never processed = %v, want retries exhausted, unavailable", err)
	}
	if got := r.rt.sent(); got != "[8 4 1 2 2 2]" {
		t.Fatalf("deletes per BatchWriteItem %s, want three stalled rounds of 2", got)
	}
}

// Throttling, a 5xx and a lost response are all sent again: a delete is
// idempotent.
func TestDeleteLooseRetriesTransportFailures(t *testing.T) {
	r := newLooseRig(t, 4)
	keys := r.fill(t, 5)
	r.rt.faults = []fault{throttle, fail500, drop}
	if err := r.store.DeleteLoose(t.Context(), "p", keys[:3]); err != nil {
		t.Fatalf("delete loose after a throttle, a 500 and a lost response: %v", err)
	}
	wantLeft(t, r.store, "p", keys, 3, 4)
	if st := r.store.Stats(); st.BatchWriteItem != 4 || st.Retries != 3 || st.Throttled != 1 {
		t.Fatalf("stats %+v", st)
	}
	r.rt.faults = []fault{fail500, fail500, fail500, fail500}
	err := r.store.DeleteLoose(t.Context(), "p", keys[3:])
	if !errors.Is(err, dynamo.ErrRetriesExhausted) || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Fatalf("delete loose after only 500s = %v, want retries exhausted, unavailable", err)
	}
	wantLeft(t, r.store, "p", keys, 3, 4)
}

// Keys are checked before anything is sent: one bad key deletes nothing.
func TestDeleteLooseRefusesBadKeys(t *testing.T) {
	r := newLooseRig(t, 3)
	keys := r.fill(t, 3)
	for _, c := range []struct {
		p   relaycore.Partition
		bad string
	}{
		{"p", ""},
		{"p", strings.Repeat("é", 600)},
		{"", "k"},
		{relaycore.Partition(strings.Repeat("p", relaycore.MaxPartitionLen+1)), "k"},
	} {
		err := r.store.DeleteLoose(t.Context(), c.p, append([]string{keys[0], keys[1]}, c.bad))
		if !errors.Is(err, relaycore.ErrInvalidBatch) {
			t.Fatalf("delete loose %q of %q = %v, want ErrInvalidBatch", c.p, c.bad, err)
		}
	}
	wantLeft(t, r.store, "p", keys, 0, 1, 2)
	if got := r.rt.sent(); got != "[]" {
		t.Fatalf("sent %s for refused lists", got)
	}
}
