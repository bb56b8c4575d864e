//go:build unix

package rietest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/sweep"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// asCaller is a function URL event for method path?query with body, from
// the IAM caller arn (events/api-enqueue.json otherwise).
func asCaller(t *testing.T, arn, method, path, query, body string, hdr ...string) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(withPath(t, method, path, query, body), &ev); err != nil {
		t.Fatal(err)
	}
	rc := ev["requestContext"].(map[string]any)
	rc["http"].(map[string]any)["method"] = method
	rc["authorizer"].(map[string]any)["iam"].(map[string]any)["userArn"] = arn
	if body == "" {
		delete(ev, "body")
	}
	h := ev["headers"].(map[string]any)
	for i := 0; i+1 < len(hdr); i += 2 {
		h[hdr[i]] = hdr[i+1]
	}
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The takedown flow through the real bootstraps under the Runtime
// Interface Emulator, with template.yaml's grants checked on every
// DynamoDB call each function makes (the rig's IAM check): a node (an IAM
// role in HOLD_NODES) reports on the producer URL, an operator requests on
// the ops URL, the fire function's owner pass orders, the node reads its
// order and posts its receipt, the sweep's pass reports it complete.
func TestTakedownFlow(t *testing.T) {
	r := newRig(t)
	dir := pkitest.New(t, "edge-a")
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	td := map[string]string{
		"TAKEDOWN_CA": string(ca),
		"HOLD_NODES":  "arn:aws:iam::123456789012:role/edge-a=edge-a",
	}
	apiFn, opsFn := r.start("ApiFunction", td), r.start("OpsFunction", td)
	fireFn, sweepFn := r.start("FireFunction", td), r.start("SweepFunction", td)
	node := "arn:aws:sts::123456789012:assumed-role/edge-a/device-1"
	ops := "arn:aws:sts::123456789012:assumed-role/relay-operator/alice"
	fireSource := func(src string) {
		t.Helper()
		var res map[string]any
		fireFn.invokeOK(t, []byte(fmt.Sprintf(`{"source":%q}`, src)), &res)
	}

	digest := strings.Repeat("3c", 32)
	body := fmt.Sprintf(`{"reports":[{"content_id":"seg-9f2c","sha256":%q,"size":9,"state":"held","observed_ms":%d}]}`, digest, time.Now().UnixMilli())
	var hr api.HoldingsResponse
	apiCall(t, apiFn, asCaller(t, node, "POST", "/v1/holdings", "", body, "idempotency-key", "boot/1"), 200, &hr)
	if hr.Node != "edge-a" || hr.Accepted != 1 {
		t.Fatalf("holdings: %+v", hr)
	}
	fireSource(string(takedowns.HoldingsSource("edge-a")))
	apiCall(t, apiFn, asCaller(t, "arn:aws:sts::123456789012:assumed-role/producer/session", "GET", "/v1/orders", "", ""), 403, nil)

	var tr api.TakedownResponse
	apiCall(t, opsFn, asCaller(t, ops, "POST", "/v1/takedowns", "", `{"content_id":"seg-9f2c","reason":"dmca 2026-118"}`), 200, &tr)
	if len(tr.Holders) != 1 {
		t.Fatalf("takedown: %+v", tr)
	}
	fireSource(string(takedowns.ControlSource)) // the request; the owner's pass orders
	fireSource(string(takedowns.ControlSource)) // the order
	var or api.OrdersResponse
	apiCall(t, apiFn, asCaller(t, node, "GET", "/v1/orders", "limit=10", ""), 200, &or)
	if len(or.Orders) != 1 || or.Orders[0].SHA256 != digest {
		t.Fatalf("orders: %+v", or)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "edge-a.crt"), filepath.Join(dir, "edge-a.key"))
	if err != nil {
		t.Fatal(err)
	}
	cert.Leaf, _ = x509.ParseCertificate(cert.Certificate[0])
	o := or.Orders[0]
	s, err := takedown.Sign(takedown.Receipt{Request: o.Request, ContentID: o.ContentID, SHA256: o.SHA256, Node: "edge-a", EvictedAt: time.Now().UTC()}, cert)
	if err != nil {
		t.Fatal(err)
	}
	var rr api.ReceiptResponse
	apiCall(t, apiFn, asCaller(t, node, "POST", "/v1/receipts", "", string(s.MarshalLine())), 200, &rr)
	fireSource(string(takedowns.ControlSource))

	var sr sweep.Result
	sweepFn.invokeOK(t, readEvent(t, "sweep.json"), &sr)
	if sr.Takedowns == nil || sr.Takedowns.Complete != 1 || sr.Takedowns.Pending != 0 {
		t.Fatalf("sweep: %+v %+v", sr, sr.Takedowns)
	}
	var st takedowns.Status
	apiCall(t, opsFn, asCaller(t, ops, "GET", "/v1/takedowns/"+tr.ID, "", ""), 200, &st)
	if !st.Complete || st.ReceiptsVerified != 1 {
		t.Fatalf("status: %+v", st)
	}
	resp := apiCall(t, opsFn, asCaller(t, ops, "GET", "/v1/takedowns/"+tr.ID+"/receipts", "", ""), 200, nil)
	if resp.Headers["content-type"] != api.ReceiptFileType || resp.Body != string(s.MarshalLine())+"\n" {
		t.Fatalf("receipts: %v %q", resp.Headers, resp.Body)
	}
}
