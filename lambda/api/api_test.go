package api_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
)

type kicks struct {
	mu sync.Mutex
	n  int
}

func (k *kicks) Kick(context.Context, relaycore.Partition, int64) error {
	k.mu.Lock()
	k.n++
	k.mu.Unlock()
	return nil
}

func newHandler() (*api.Handler, *mem.Store, *kicks) {
	st := mem.New(relaycore.Capabilities{})
	k := &kicks{}
	return &api.Handler{Source: st, Enqueue: relaycore.EnqueueConfig{Kicker: k}, MaxBodyBytes: 4096, MaxRows: 4}, st, k
}

// request builds a function URL request like the ones in events/.
func request(method, rawPath, query, body string) events.LambdaFunctionURLRequest {
	r := events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: rawPath, RawQueryString: query, Body: body,
		Headers: map[string]string{"content-type": "application/json"},
	}
	r.RequestContext.HTTP.Method = method
	r.RequestContext.HTTP.Path = rawPath
	r.RequestContext.Authorizer = &events.LambdaFunctionURLRequestContextAuthorizerDescription{
		IAM: &events.LambdaFunctionURLRequestContextAuthorizerIAMDescription{UserARN: "arn:aws:sts::123456789012:assumed-role/producer/s"},
	}
	return r
}

func call(t *testing.T, h *api.Handler, req events.LambdaFunctionURLRequest) events.LambdaFunctionURLResponse {
	t.Helper()
	payload, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.Handle(t.Context(), payload)
	if err != nil {
		t.Fatalf("handle: %v", err)
	}
	if resp.Headers["content-type"] != "application/json" || !json.Valid([]byte(resp.Body)) {
		t.Fatalf("response is not JSON: %+v", resp)
	}
	return resp
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

const rowsPath = "/v1/sources/orders/rows"

var goodBody = `{"rows":[{"target":"customer-42","puts":[{"key":"order/1","value":"` + b64(`{"total":1}`) + `"}],"deletes":["cart/1"]},{"target":"customer-7","puts":[{"key":"order/2","value":""}]}]}`

func TestEnqueueAndQuery(t *testing.T) {
	h, st, k := newHandler()
	resp := call(t, h, request("POST", rowsPath, "", goodBody))
	if resp.StatusCode != 200 {
		t.Fatalf("enqueue: %d %s", resp.StatusCode, resp.Body)
	}
	var enq api.EnqueueResponse
	if err := json.Unmarshal([]byte(resp.Body), &enq); err != nil {
		t.Fatal(err)
	}
	if enq.Source != "orders" || len(enq.Seqs) != 2 || enq.Seqs[0] != 1 || enq.Seqs[1] != 2 || enq.AlarmDueMS == 0 {
		t.Errorf("enqueue response %+v", enq)
	}
	if k.n != 1 {
		t.Errorf("%d kicks, want 1 after a commit", k.n)
	}
	v, err := relaycore.InspectSource(t.Context(), st, "orders")
	if err != nil {
		t.Fatal(err)
	}
	rows := v.Rows()
	if len(rows) != 2 || string(rows[0].Puts[0].Value) != `{"total":1}` || rows[0].Deletes[0] != "cart/1" || len(rows[1].Puts[0].Value) != 0 {
		t.Errorf("stored rows %+v", rows)
	}

	var st1 api.StateResponse
	resp = call(t, h, request("GET", "/v1/sources/orders/state", "", ""))
	if err := json.Unmarshal([]byte(resp.Body), &st1); err != nil || resp.StatusCode != 200 {
		t.Fatalf("state: %d %s", resp.StatusCode, resp.Body)
	}
	if st1.NextSeq != 3 || st1.FirstUndelivered != 1 || st1.Empty {
		t.Errorf("state %+v", st1)
	}
	var dt api.DeliveredResponse
	resp = call(t, h, request("GET", "/v1/sources/orders/delivered-through", "seq=2", ""))
	if err := json.Unmarshal([]byte(resp.Body), &dt); err != nil || resp.StatusCode != 200 || dt.Delivered || dt.Seq != 2 {
		t.Errorf("delivered-through: %d %s", resp.StatusCode, resp.Body)
	}
	var wm api.WatermarkResponse
	resp = call(t, h, request("GET", "/v1/sources/orders/watermark", "", ""))
	if err := json.Unmarshal([]byte(resp.Body), &wm); err != nil || resp.StatusCode != 200 || wm.WatermarkMS != enq.AlarmDueMS {
		t.Errorf("watermark: %d %s, want the commit time %d", resp.StatusCode, resp.Body, enq.AlarmDueMS)
	}
}

func TestEncodedSourceID(t *testing.T) {
	h, st, _ := newHandler()
	resp := call(t, h, request("POST", "/v1/sources/tenant%2F42/rows", "", goodBody))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, resp.Body)
	}
	if _, ok := st.Dump()["tenant/42"]; !ok {
		t.Errorf("rows not under the decoded source id: %v", st.Dump())
	}
}

// TestRefusals: every malformed request gets its 4xx and a JSON error,
// and nothing is written.
func TestRefusals(t *testing.T) {
	noIAM := request("POST", rowsPath, "", goodBody)
	noIAM.RequestContext.Authorizer = nil
	textPlain := request("POST", rowsPath, "", goodBody)
	textPlain.Headers["content-type"] = "text/plain"
	badB64Flag := request("POST", rowsPath, "", "%%%")
	badB64Flag.IsBase64Encoded = true
	for _, tc := range []struct {
		name   string
		req    events.LambdaFunctionURLRequest
		status int
		code   string
		row    int // -1: no row
	}{
		{"no IAM caller", noIAM, 403, "forbidden", -1},
		{"unknown route", request("GET", "/v1/enqueue", "", ""), 404, "not_found", -1},
		{"unknown action", request("GET", "/v1/sources/orders/rowz", "", ""), 404, "not_found", -1},
		{"trailing slash", request("POST", rowsPath+"/", "", goodBody), 404, "not_found", -1},
		{"wrong method", request("GET", rowsPath, "", ""), 405, "method_not_allowed", -1},
		{"bad escape in id", request("POST", "/v1/sources/a%zz/rows", "", goodBody), 400, "bad_request", -1},
		{"reserved source", request("POST", "/v1/sources/_relay%2Fx/rows", "", goodBody), 400, "bad_request", -1},
		{"content type", textPlain, 415, "unsupported_media_type", -1},
		{"query on rows", request("POST", rowsPath, "x=1", goodBody), 400, "bad_request", -1},
		{"not json", request("POST", rowsPath, "", `rows=1`), 400, "bad_request", -1},
		{"unknown field", request("POST", rowsPath, "", `{"rows":[],"extra":1}`), 400, "bad_request", -1},
		{"unknown row field", request("POST", rowsPath, "", `{"rows":[{"target":"t","puts":[],"upserts":[]}]}`), 400, "bad_request", -1},
		{"trailing data", request("POST", rowsPath, "", goodBody+`{}`), 400, "bad_request", -1},
		{"no rows", request("POST", rowsPath, "", `{}`), 400, "bad_request", -1},
		{"empty rows", request("POST", rowsPath, "", `{"rows":[]}`), 400, "bad_request", -1},
		{"too many rows", request("POST", rowsPath, "", `{"rows":[{},{},{},{},{}]}`), 413, "too_large", -1},
		{"body too large", request("POST", rowsPath, "", `{"rows":[{"target":"`+strings.Repeat("t", 5000)+`"}]}`), 413, "too_large", -1},
		{"bad base64 body", badB64Flag, 400, "bad_request", -1},
		{"missing target", request("POST", rowsPath, "", `{"rows":[{"puts":[{"key":"k","value":""}]}]}`), 400, "invalid_row", 0},
		{"missing value", request("POST", rowsPath, "", `{"rows":[{"target":"t","puts":[{"key":"k"}]}]}`), 400, "invalid_row", 0},
		{"bad base64 value", request("POST", rowsPath, "", `{"rows":[{"target":"t","puts":[{"key":"k","value":"a"}]}]}`), 400, "invalid_row", 0},
		{"engine: empty row", request("POST", rowsPath, "", `{"rows":[{"target":"t","puts":[{"key":"k","value":""}]},{"target":"t"}]}`), 400, "invalid_row", 1},
		{"engine: put and delete", request("POST", rowsPath, "", `{"rows":[{"target":"t","puts":[{"key":"k","value":""}],"deletes":["k"]}]}`), 400, "invalid_row", 0},
		{"engine: reserved key", request("POST", rowsPath, "", `{"rows":[{"target":"t","deletes":["_relay/rh/x"]}]}`), 400, "invalid_row", 0},
		{"engine: target is source", request("POST", rowsPath, "", `{"rows":[{"target":"orders","deletes":["k"]}]}`), 400, "invalid_row", 0},
		{"get with body", request("GET", "/v1/sources/orders/state", "", `{}`), 400, "bad_request", -1},
		{"state with query", request("GET", "/v1/sources/orders/state", "source=orders", ""), 400, "bad_request", -1},
		{"delivered without seq", request("GET", "/v1/sources/orders/delivered-through", "", ""), 400, "bad_request", -1},
		{"delivered seq zero", request("GET", "/v1/sources/orders/delivered-through", "seq=0", ""), 400, "bad_request", -1},
		{"delivered seq text", request("GET", "/v1/sources/orders/delivered-through", "seq=two", ""), 400, "bad_request", -1},
		{"delivered seq twice", request("GET", "/v1/sources/orders/delivered-through", "seq=1&seq=2", ""), 400, "bad_request", -1},
		{"delivered extra param", request("GET", "/v1/sources/orders/delivered-through", "seq=1&through=2", ""), 400, "bad_request", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, st, k := newHandler()
			resp := call(t, h, tc.req)
			var body api.ErrorBody
			if err := json.Unmarshal([]byte(resp.Body), &body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || body.Error.Message == "" {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, resp.Body, tc.status, tc.code)
			}
			if (tc.row >= 0) != (body.Error.Row != nil) || (body.Error.Row != nil && *body.Error.Row != tc.row) {
				t.Errorf("error row = %v, want %d", body.Error.Row, tc.row)
			}
			if len(st.Dump()) != 0 || k.n != 0 {
				t.Errorf("a refused request wrote %v or kicked %d times", st.Dump(), k.n)
			}
		})
	}
}

func TestMethodNotAllowedSaysWhich(t *testing.T) {
	h, _, _ := newHandler()
	resp := call(t, h, request("DELETE", "/v1/sources/orders/state", "", ""))
	if resp.StatusCode != 405 || resp.Headers["allow"] != "GET" {
		t.Errorf("got %d allow=%q", resp.StatusCode, resp.Headers["allow"])
	}
}

// TestNotAFunctionURLEvent: an event of another shape (events/malformed.json,
// a fire event) is an invalid event, not an HTTP response.
func TestNotAFunctionURLEvent(t *testing.T) {
	malformed, err := os.ReadFile(filepath.Join("..", "..", "events", "malformed.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, payload := range map[string]string{
		"malformed.json": string(malformed),
		"fire event":     `{"source":"orders"}`,
		"version 1":      `{"version":"1.0","rawPath":"/","requestContext":{"http":{"method":"GET"}}}`,
		"no path":        `{"version":"2.0","requestContext":{"http":{"method":"GET"}}}`,
		"not json":       `{`,
	} {
		t.Run(name, func(t *testing.T) {
			h, st, _ := newHandler()
			_, err := h.Handle(t.Context(), []byte(payload))
			var ie *event.InvalidEventError
			if !errors.As(err, &ie) || ie.Function != "api" {
				t.Fatalf("err = %v, want *event.InvalidEventError", err)
			}
			if len(st.Dump()) != 0 {
				t.Error("wrote to the store")
			}
		})
	}
}

// TestRepoEvents runs events/api-*.json through the handler, so the
// samples `sam local invoke` uses stay valid requests.
func TestRepoEvents(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "events", "api-*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no api events: %v", err)
	}
	h, _, _ := newHandler()
	h.MaxBodyBytes = 0
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			payload, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := h.Handle(t.Context(), payload)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s %v", f, resp.StatusCode, resp.Body, err)
			}
		})
	}
}

// TestCommitDeadline: the enqueue deadline keeps a margin before the
// invocation's deadline, so a nearly timed-out invocation refuses to start
// a commit and says so (503 with Retry-After) instead of being killed
// mid-way.
func TestCommitDeadline(t *testing.T) {
	h, st, _ := newHandler()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second) // < commitMargin
	defer cancel()
	payload, _ := json.Marshal(request("POST", rowsPath, "", goodBody))
	resp, err := h.Handle(ctx, payload)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || !strings.Contains(resp.Body, "deadline") {
		t.Errorf("got %d %s, want 503 deadline", resp.StatusCode, resp.Body)
	}
	// A producer is told when to retry (with its Idempotency-Key).
	if ra := resp.Headers["retry-after"]; ra != "1" {
		t.Errorf("retry-after %q on a 503 unavailable, want 1", ra)
	}
	if len(st.Dump()) != 0 {
		t.Error("rows written after the deadline")
	}
}
