package api_test

import (
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
