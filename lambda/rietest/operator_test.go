//go:build unix

package rietest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// startOperator runs the ops function (the api bootstrap with
// RELAY_API_ROUTES=operator, env.json's OpsFunction section); its DynamoDB
// calls are checked against template.yaml's OpsFunction grants.
func (r *rig) startOperator() *function {
	r.t.Helper()
	f := r.start("OpsFunction", nil)
	if env := r.env("OpsFunction", nil); env["RELAY_API_ROUTES"] != "operator" {
		r.t.Fatalf("env.json OpsFunction RELAY_API_ROUTES=%q, want operator", env["RELAY_API_ROUTES"])
	}
	return f
}

// call sends a function URL request and checks the HTTP status.
func call(t *testing.T, f *function, method, path, query, body string, want int, out any) urlResponse {
	t.Helper()
	return apiCall(t, f, withPath(t, method, path, query, body), want, out)
}

func rowJSON(target, key, value string) api.RowJSON {
	v := b64(value)
	return api.RowJSON{Target: target, Puts: []api.PutJSON{{Key: key, Value: &v}}}
}

func (r *rig) targetValue(target, key string) string {
	r.t.Helper()
	v, ok, err := r.target.Get(r.t.Context(), relaycore.Partition(target), key)
	if err != nil {
		r.t.Fatal(err)
	}
	if !ok {
		return "<absent>"
	}
	return string(v)
}

// TestOperatorRoundTrip: through the emulator, a producer enqueues rows
// for a poisoned target and a healthy one; the operator API quarantines the
// poisoned target, a fire delivers the healthy row and holds the others,
// the operator skips the poison row (a stale expect_first first: 409 with
// the actual seq), releases, and the next fire delivers the rest in order;
// the archive exports the skipped row and re-enqueues it.
func TestOperatorRoundTrip(t *testing.T) {
	r := newRig(t)
	producer := r.start("ApiFunction", nil)
	operator := r.startOperator()
	fireFn := r.start("FireFunction", nil)

	body, _ := json.Marshal(enqueuedRows{Rows: []api.RowJSON{
		rowJSON("t1", "k", "poison"), rowJSON("t1", "k", "v2"), rowJSON("t1", "j", "v3"), rowJSON("t2", "k", "ok")}})
	var enq api.EnqueueResponse
	call(t, producer, "POST", "/v1/sources/orders/rows", "", string(body), 200, &enq)

	var tr api.TargetResponse
	call(t, operator, "POST", "/v1/sources/orders/targets/t1/quarantine", "", `{"reason":"order 1 is refused"}`, 200, &tr)
	if tr.Status.State != relaycore.StateQuarantined || tr.Status.Note.By != "123456789012:assumed-role/producer/session" {
		t.Fatalf("quarantine: %+v %+v", tr.Status, tr.Status.Note)
	}
	var fr fire.Result
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)
	if got := r.targetValue("t2", "k"); got != "ok" {
		t.Fatalf("healthy target: %q (fire %+v)", got, fr)
	}
	if got := r.targetValue("t1", "k"); got != "<absent>" {
		t.Fatalf("quarantined target received %q", got)
	}

	var list api.TargetsResponse
	call(t, operator, "GET", "/v1/sources/orders/targets", "state=quarantined", "", 200, &list)
	if len(list.Targets) != 1 || list.Targets[0].HeldFirst != 1 || list.Targets[0].HeldLast != 3 {
		t.Fatalf("quarantined targets %+v", list.Targets)
	}
	var eb api.ErrorBody
	call(t, operator, "POST", "/v1/sources/orders/targets/t1/skip", "", `{"expect_first":2,"through":2,"reason":"poison"}`, 409, &eb)
	if eb.Error.Code != "skip_conflict" || eb.Error.ActualFirst == nil || *eb.Error.ActualFirst != 1 {
		t.Fatalf("stale skip: %+v", eb)
	}
	var skip api.SkipResponse
	call(t, operator, "POST", "/v1/sources/orders/targets/t1/skip", "", `{"expect_first":1,"through":1,"reason":"poison"}`, 200, &skip)
	if skip.ArchiveID != 1 || skip.Rows != 1 {
		t.Fatalf("skip %+v", skip)
	}
	call(t, operator, "POST", "/v1/sources/orders/targets/t1/release", "", `{"reason":"fixed"}`, 200, &tr)
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)
	if k, j := r.targetValue("t1", "k"), r.targetValue("t1", "j"); k != "v2" || j != "v3" {
		t.Fatalf("after release: k=%q j=%q, want v2 v3", k, j)
	}
	rh, err := relaycore.TargetWatermark(t.Context(), r.target, "t1", "orders")
	if err != nil || rh != 3 {
		t.Errorf("t1 rh = %d (%v), want 3", rh, err)
	}

	var ex api.ArchiveExportResponse
	call(t, operator, "GET", "/v1/sources/orders/archive/export", "", "", 200, &ex)
	if len(ex.Entries) != 1 || len(ex.Entries[0].Data) != 1 || *ex.Entries[0].Data[0].Puts[0].Value != b64("poison") || ex.Entries[0].By == "" {
		t.Fatalf("export %+v", ex)
	}
	var rq api.RequeueResponse
	call(t, operator, "POST", "/v1/sources/orders/archive/1/requeue", "", `{}`, 200, &rq)
	if !slices.Equal(rq.Seqs, []uint64{5}) {
		t.Fatalf("requeue %+v", rq)
	}
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)
	if got := r.targetValue("t1", "k"); got != "poison" {
		t.Errorf("requeued row not delivered: %q", got)
	}
	call(t, producer, "GET", "/v1/sources/orders/state", "", "", 200, nil)
}

// TestOperatorBadInput: each bad operator request through the emulator is
// a clear 4xx JSON error and sends no DynamoDB write; the producer set
// refuses the operator routes.
func TestOperatorBadInput(t *testing.T) {
	r := newRig(t)
	producer := r.start("ApiFunction", nil)
	operator := r.startOperator()
	fireFn := r.start("FireFunction", nil)
	body, _ := json.Marshal(enqueuedRows{Rows: []api.RowJSON{rowJSON("t1", "k", "v1"), rowJSON("t1", "k", "v2"), rowJSON("t2", "k", "v")}})
	call(t, producer, "POST", "/v1/sources/orders/rows", "", string(body), 200, nil)
	call(t, operator, "POST", "/v1/sources/orders/targets/t1/pause", "", `{"reason":"maintenance"}`, 200, nil)
	var fr fire.Result
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)

	const tp = "/v1/sources/orders/targets/t1/"
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown target", "POST", "/v1/sources/orders/targets/nobody/pause", `{}`, 404, "unknown_target"},
		{"skip past the last seq", "POST", tp + "skip", `{"expect_first":1,"through":3,"reason":"x"}`, 422, "skip_range"},
		{"reason too long", "POST", tp + "quarantine", fmt.Sprintf(`{"reason":%q}`, strings.Repeat("r", relaycore.MaxReasonLen+1)), 400, "bad_request"},
		{"wrong method", "GET", tp + "skip", "", 405, "method_not_allowed"},
		{"wrong state", "POST", tp + "release", `{}`, 409, "wrong_state"},
		{"malformed json", "POST", tp + "resume", `{"reason"`, 400, "bad_request"},
		{"unknown field", "POST", tp + "resume", `{"reason":"x","by":"someone else"}`, 400, "bad_request"},
		{"enqueue on the operator URL", "POST", "/v1/sources/orders/rows", string(body), 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, _ := r.txCount("")
			var eb api.ErrorBody
			resp := call(t, operator, tc.method, tc.path, "", tc.body, tc.status, &eb)
			if eb.Error.Code != tc.code || eb.Error.Message == "" || resp.Headers["content-type"] != "application/json" {
				t.Errorf("%d %s, want code %s", resp.StatusCode, resp.Body, tc.code)
			}
			if now, _ := r.txCount(""); now != sent {
				t.Errorf("%d DynamoDB transactions sent for a refused request", now-sent)
			}
		})
	}
	// A stale expect_first is found under the source's claim: the only
	// writes are the claim taken and released (rs), nothing else.
	before := len(r.committed())
	var eb api.ErrorBody
	call(t, operator, "POST", tp+"skip", "", `{"expect_first":2,"through":2,"reason":"x"}`, 409, &eb)
	if eb.Error.Code != "skip_conflict" || *eb.Error.ActualFirst != 1 {
		t.Errorf("stale skip: %+v", eb)
	}
	for _, tx := range r.committed()[before:] {
		var w wireTx
		if err := json.Unmarshal(tx.body, &w); err != nil {
			t.Fatal(err)
		}
		for _, it := range w.TransactItems {
			if it.Put != nil && it.Put.Item["k"].S != relaycore.KeyRS || it.Delete != nil {
				t.Errorf("a refused skip wrote more than rs: %s", tx.body)
			}
		}
	}

	for _, path := range []string{"/v1/sources/orders/targets", tp + "quarantine", "/v1/sources/orders/archive/export"} {
		method, b := "GET", ""
		if strings.HasSuffix(path, "quarantine") {
			method, b = "POST", `{}`
		}
		sent, _ := r.txCount("")
		var eb api.ErrorBody
		call(t, producer, method, path, "", b, 404, &eb)
		if eb.Error.Code != "not_found" || !strings.Contains(eb.Error.Message, "producer") {
			t.Errorf("producer URL, %s %s: %+v", method, path, eb)
		}
		if now, _ := r.txCount(""); now != sent {
			t.Errorf("producer URL wrote for %s", path)
		}
	}
}

// TestUnknownRouteSetRefusedAtStart: RELAY_API_ROUTES outside
// producer|operator|all stops the api function at init.
func TestUnknownRouteSetRefusedAtStart(t *testing.T) {
	r := newRig(t)
	f := r.start("ApiFunction", map[string]string{"RELAY_API_ROUTES": "admin"})
	status, body := f.invoke(t, readEvent(t, "api-state.json"))
	if status == http.StatusOK && !strings.Contains(string(body), "errorMessage") {
		t.Fatalf("invocation with RELAY_API_ROUTES=admin succeeded: %d %s", status, body)
	}
	if !f.logContains(`RELAY_API_ROUTES: route set "admin"`) {
		t.Errorf("emulator output lacks the start-up error:\n%s", f.log.String())
	}
}
