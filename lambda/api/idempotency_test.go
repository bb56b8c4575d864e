package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

func keyed(key, body string) events.LambdaFunctionURLRequest {
	r := request("POST", rowsPath, "", body)
	r.Headers["idempotency-key"] = key
	return r
}

func errorOf(t *testing.T, resp events.LambdaFunctionURLResponse) api.ErrorBody {
	t.Helper()
	var body api.ErrorBody
	if err := json.Unmarshal([]byte(resp.Body), &body); err != nil {
		t.Fatal(err)
	}
	return body
}

// A retry with the same Idempotency-Key and body (the client lost the
// first response) answers with the first request's seqs and
// "replayed": true, writes nothing and kicks nothing; the same key with
// another body is 409 idempotency_key_reused.
func TestIdempotencyKeyHeader(t *testing.T) {
	h, st, k := newHandler()
	resp := call(t, h, keyed("order-1.try", goodBody))
	var first api.EnqueueResponse
	if err := json.Unmarshal([]byte(resp.Body), &first); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first: %d %s", resp.StatusCode, resp.Body)
	}
	if first.Replayed || strings.Contains(resp.Body, "replayed") || !slices.Equal(first.Seqs, []uint64{1, 2}) {
		t.Fatalf("first response %s", resp.Body)
	}
	dump, kicked := st.Dump(), k.n

	resp = call(t, h, keyed("order-1.try", goodBody))
	var again api.EnqueueResponse
	if err := json.Unmarshal([]byte(resp.Body), &again); err != nil || resp.StatusCode != 200 {
		t.Fatalf("retry: %d %s", resp.StatusCode, resp.Body)
	}
	if !again.Replayed || !slices.Equal(again.Seqs, first.Seqs) || !strings.Contains(resp.Body, `"replayed":true`) {
		t.Errorf("retry response %s, want replayed with seqs %v", resp.Body, first.Seqs)
	}
	if !reflect.DeepEqual(st.Dump(), dump) || k.n != kicked {
		t.Errorf("replay wrote to the store or kicked (%d kicks, was %d)", k.n, kicked)
	}

	other := strings.Replace(goodBody, "order/2", "order/3", 1)
	resp = call(t, h, keyed("order-1.try", other))
	if body := errorOf(t, resp); resp.StatusCode != 409 || body.Error.Code != "idempotency_key_reused" {
		t.Errorf("reuse: %d %s, want 409 idempotency_key_reused", resp.StatusCode, resp.Body)
	}
	if !reflect.DeepEqual(st.Dump(), dump) {
		t.Errorf("refused reuse wrote to the store")
	}
	// Without the header the same body is a new enqueue.
	resp = call(t, h, request("POST", rowsPath, "", goodBody))
	if err := json.Unmarshal([]byte(resp.Body), &again); err != nil || resp.StatusCode != 200 || !slices.Equal(again.Seqs, []uint64{3, 4}) {
		t.Errorf("unkeyed: %d %s", resp.StatusCode, resp.Body)
	}
}

func TestIdempotencyKeyHeaderRefusals(t *testing.T) {
	for name, key := range map[string]string{
		"empty":     "",
		"space":     "a b",
		"two keys":  "k1,k2",
		"too long":  strings.Repeat("k", relaycore.MaxIdempotencyKeyLen+1),
		"non-ascii": "clé",
	} {
		t.Run(name, func(t *testing.T) {
			h, st, k := newHandler()
			resp := call(t, h, keyed(key, goodBody))
			body := errorOf(t, resp)
			if resp.StatusCode != 400 || body.Error.Code != "bad_request" || !strings.Contains(body.Error.Message, "Idempotency-Key") {
				t.Errorf("%d %s, want 400 bad_request naming the header", resp.StatusCode, resp.Body)
			}
			if len(st.Dump()) != 0 || k.n != 0 {
				t.Errorf("refused request wrote or kicked")
			}
		})
	}
}

// Rows that do not fit one source batch with the idempotency record are
// 413 too_large with the header, and nothing is written; without the
// header they commit in a chain of batches.
func TestIdempotencyKeyTooLarge(t *testing.T) {
	h, _, _ := newHandler()
	st := mem.New(relaycore.Capabilities{MaxBatchItems: 5})
	h.Source = st
	var rows []string
	for i := range 4 {
		rows = append(rows, fmt.Sprintf(`{"target":"t%d","deletes":["k"]}`, i))
	}
	body := `{"rows":[` + strings.Join(rows, ",") + `]}`
	resp := call(t, h, keyed("big", body))
	if e := errorOf(t, resp); resp.StatusCode != 413 || e.Error.Code != "too_large" || len(e.Seqs) != 0 {
		t.Fatalf("%d %s, want 413 too_large", resp.StatusCode, resp.Body)
	}
	if len(st.Dump()) != 0 {
		t.Fatalf("refused request wrote %v", st.Dump())
	}
	if resp := call(t, h, request("POST", rowsPath, "", body)); resp.StatusCode != 200 {
		t.Fatalf("without the header: %d %s", resp.StatusCode, resp.Body)
	}
}

// lostCommit is the fault around a real store of a database that goes
// away around a commit: while armed, Apply commits the batch and then
// answers "maybe applied, store unavailable", and every read after fails
// as unavailable, so the engine cannot re-read its outcome.
type lostCommit struct {
	relaycore.Store
	armed, cut bool
}

var errGone = fmt.Errorf("%w: connection reset by peer", relaycore.ErrUnavailable)

func (s *lostCommit) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if s.cut {
		return errGone
	}
	if err := s.Store.Apply(ctx, p, b); err != nil || !s.armed {
		return err
	}
	s.cut = true
	return fmt.Errorf("%w: %w", relaycore.ErrMaybeApplied, errGone)
}

func (s *lostCommit) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if s.cut {
		return nil, false, errGone
	}
	return s.Store.Get(ctx, p, key)
}

func (s *lostCommit) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if s.cut {
		return relaycore.ScanPage{}, errGone
	}
	return s.Store.Scan(ctx, p, req)
}

// A store out of reach is 503 with retry-after, not 500 internal: an
// enqueue whose commit's outcome is lost is commit_unknown, saying to
// retry with the same Idempotency-Key, and that retry, once the store is
// back, answers the rows committed once (replayed); an enqueue or a read
// while it is out of reach is unavailable, nothing written.
func TestStoreUnavailableAnswers(t *testing.T) {
	h, st, _ := newHandler()
	f := &lostCommit{Store: st, armed: true}
	h.Source = f
	resp := call(t, h, keyed("order-9", goodBody))
	body := errorOf(t, resp)
	if resp.StatusCode != 503 || body.Error.Code != "commit_unknown" || resp.Headers["retry-after"] != "1" ||
		!strings.Contains(body.Error.Message, "same Idempotency-Key") {
		t.Fatalf("lost commit: %d %s (retry-after %q); want 503 commit_unknown with retry-after", resp.StatusCode, resp.Body, resp.Headers["retry-after"])
	}
	resp = call(t, h, keyed("order-10", goodBody))
	if body := errorOf(t, resp); resp.StatusCode != 503 || body.Error.Code != "unavailable" || resp.Headers["retry-after"] != "1" ||
		!strings.Contains(body.Error.Message, "the request's rows were not committed") || body.Seqs != nil ||
		strings.Contains(body.Error.Message, "in seqs") {
		// Nothing committed: the body has no seqs, and the message points to none.
		t.Fatalf("enqueue while out of reach: %d %s; want 503 unavailable naming the request's rows", resp.StatusCode, resp.Body)
	}
	resp = call(t, h, request("GET", "/v1/sources/orders/delivered-through", "seq=1", ""))
	if body := errorOf(t, resp); resp.StatusCode != 503 || body.Error.Code != "unavailable" || resp.Headers["retry-after"] != "1" {
		t.Fatalf("read while out of reach: %d %s; want 503 unavailable", resp.StatusCode, resp.Body)
	}
	f.armed, f.cut = false, false
	resp = call(t, h, keyed("order-9", goodBody))
	var again api.EnqueueResponse
	if err := json.Unmarshal([]byte(resp.Body), &again); err != nil || resp.StatusCode != 200 || !again.Replayed || !slices.Equal(again.Seqs, []uint64{1, 2}) {
		t.Fatalf("retry with the same key: %d %s; want the first commit's seqs 1, 2 replayed", resp.StatusCode, resp.Body)
	}
}

// cancelledStore answers every call as a store does whose caller's
// context ended mid-call (the client went away): context.Canceled.
type cancelledStore struct{ relaycore.Store }

func (cancelledStore) Get(ctx context.Context, _ relaycore.Partition, _ string) ([]byte, bool, error) {
	return nil, false, fmt.Errorf("read: %w", context.Canceled)
}

func (cancelledStore) Scan(ctx context.Context, _ relaycore.Partition, _ relaycore.ScanRequest) (relaycore.ScanPage, error) {
	return relaycore.ScanPage{}, fmt.Errorf("scan: %w", context.Canceled)
}

func (cancelledStore) GetMany(ctx context.Context, _ relaycore.Partition, _ []string) (map[string][]byte, error) {
	return nil, fmt.Errorf("getmany: %w", context.Canceled)
}

// A request whose store calls were cut short by its own end (the client
// went away) is a 503 unavailable logged at WARN, as a store out of reach
// is, not a 500 internal that points an operator at a corrupt record.
func TestRequestEndedIsNotInternal(t *testing.T) {
	h, st, _ := newHandler()
	h.Source = cancelledStore{st}
	for _, req := range []events.LambdaFunctionURLRequest{
		request("POST", rowsPath, "", goodBody),
		request("GET", "/v1/sources/orders/state", "", ""),
	} {
		resp := call(t, h, req)
		if body := errorOf(t, resp); resp.StatusCode != 503 || body.Error.Code != "unavailable" || body.Seqs != nil ||
			!strings.Contains(body.Error.Message, "the request ended before the store answered") {
			t.Errorf("%s %s: %d %s, want 503 unavailable", req.RequestContext.HTTP.Method, req.RawPath, resp.StatusCode, resp.Body)
		}
	}
}
