package relayserve_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// poll asks until ok says yes; the deadline guards against a hang.
func poll[T any](t *testing.T, what string, ask func() T, ok func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(servetest.StartTimeout)
	for {
		v := ask()
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last %+v", what, servetest.StartTimeout, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func keyPairOf(t testing.TB, dir, name string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
		t.Fatal(err)
	}
	return c
}

func signReceipt(t testing.TB, cert tls.Certificate, node string, o takedowns.Order) []byte {
	t.Helper()
	s, err := takedown.Sign(takedown.Receipt{Request: o.Request, ContentID: o.ContentID, SHA256: o.SHA256, Node: node,
		EvictedAt: time.Now().UTC()}, cert)
	if err != nil {
		t.Fatal(err)
	}
	return s.MarshalLine()
}

// The takedown routes over real HTTPS against a real relay serve, every
// caller a client certificate of edgectl pki's CA: nodes report, an
// operator with the takedown role requests, the owner orders each holder
// (a node reads only its own orders), hostile receipts are refused, and
// the takedown is complete only after both holders' receipts; the exported
// receipt file verifies with the CA alone.
func TestTakedownOverHTTPS(t *testing.T) {
	f := newFixture(t, "  td-op: {takedown: true}\n  edge-a: {hold: true}\n  edge-b: {hold: true}\n  edge-c: {hold: true}\n")
	for _, n := range []string{"edge-a", "edge-b", "edge-c"} {
		pkitest.Issue(t, f.pki, n, pki.UsageNode)
	}
	pkitest.Issue(t, f.pki, "td-op", pki.UsageClient)
	p := f.start(t)
	base := p.URL
	cl := func(n string) *clientT { return &clientT{t, f.client(t, p, n), base} }
	a, b, cc, op := cl("edge-a"), cl("edge-b"), cl("edge-c"), cl("td-op")
	digest := strings.Repeat("5e", 32)
	observed := time.Now().UnixMilli()
	report := func(n *clientT, key, content, state string) result {
		body, _ := json.Marshal(api.HoldingsRequest{Reports: []takedowns.Report{{ContentID: content, SHA256: digest, Size: 10,
			State: state, ObservedMS: observed}}})
		return n.do("POST", "/v1/holdings", body, "Idempotency-Key", key)
	}
	for _, n := range []*clientT{a, b} {
		if r := report(n, "boot/1", "seg-9f2c", "held"); r.status != 200 {
			t.Fatalf("report: %d %s", r.status, r.body)
		}
	}
	if r := report(a, "boot/1", "seg-9f2c", "held"); r.status != 200 || !strings.Contains(string(r.body), `"replayed":true`) {
		t.Fatalf("replayed report: %d %s", r.status, r.body)
	}
	if r := report(a, "boot/1", "seg-other", "held"); r.status != 409 || r.errCode(t) != "idempotency_key_reused" {
		t.Fatalf("key reused: %d %s", r.status, r.body)
	}
	if r := report(op, "x", "seg-9f2c", "held"); r.status != 403 {
		t.Fatalf("a report without the hold role: %d %s", r.status, r.body)
	}
	if r := a.do("GET", "/v1/holdings/seg-9f2c", nil); r.status != 403 {
		t.Fatalf("the holder index read by a node: %d %s", r.status, r.body)
	}
	// A producer cannot forge a holder report through the rows route.
	if r := do(t, f.client(t, p, ""), "POST", base+"/v1/sources/orders/rows", f.tokens["producer"],
		rowsBody(string(takedowns.HoldersTarget("seg-9f2c")), "seg-9f2c/edge-z", "{}")); r.status != 400 || r.errCode(t) != "invalid_row" {
		t.Fatalf("a forged report row: %d %s", r.status, r.body)
	}
	poll(t, "both holders indexed", func() api.HoldersResponse {
		var h api.HoldersResponse
		json.Unmarshal(op.do("GET", "/v1/holdings/seg-9f2c", nil).body, &h)
		return h
	}, func(h api.HoldersResponse) bool { return len(h.Holders) == 2 })

	reqBody := []byte(`{"content_id":"seg-9f2c","reason":"dmca 2026-118"}`)
	r := op.do("POST", "/v1/takedowns", reqBody, "Idempotency-Key", "dmca-2026-118")
	var td api.TakedownResponse
	if json.Unmarshal(r.body, &td); r.status != 200 || td.RequestedBy != "td-op" || len(td.Holders) != 2 || td.Replayed {
		t.Fatalf("request: %d %s", r.status, r.body)
	}
	// Retried with its key (a lost answer): the same takedown, replayed,
	// once its record is in the open list (503 takedown_pending before).
	again := poll(t, "the retried request answered", func() result {
		return op.do("POST", "/v1/takedowns", reqBody, "Idempotency-Key", "dmca-2026-118")
	}, func(r result) bool { return r.status != 503 || r.errCode(t) != "takedown_pending" })
	var td2 api.TakedownResponse
	if json.Unmarshal(again.body, &td2); again.status != 200 || !td2.Replayed || td2.ID != td.ID || len(td2.Holders) != 2 {
		t.Fatalf("retried request: %d %s, want takedown %s replayed", again.status, again.body, td.ID)
	}
	if r := op.do("POST", "/v1/takedowns", []byte(`{"content_id":"seg-9f2c","reason":"another"}`), "Idempotency-Key", "dmca-2026-118"); r.status != 409 || r.errCode(t) != "idempotency_key_reused" {
		t.Fatalf("the key with another reason: %d %s", r.status, r.body)
	}
	if r := op.do("POST", "/v1/takedowns", reqBody, "Idempotency-Key", "not a key"); r.status != 400 || r.errCode(t) != "bad_request" {
		t.Fatalf("a malformed key: %d %s", r.status, r.body)
	}
	orders := func(n *clientT, q string) api.OrdersResponse {
		var o api.OrdersResponse
		if r := n.do("GET", "/v1/orders"+q, nil); r.status != 200 {
			t.Fatalf("orders: %d %s", r.status, r.body)
		} else {
			json.Unmarshal(r.body, &o)
		}
		return o
	}
	own := map[string]takedowns.Order{}
	for name, n := range map[string]*clientT{"edge-a": a, "edge-b": b} {
		o := poll(t, name+"'s order", func() api.OrdersResponse { return orders(n, "") },
			func(o api.OrdersResponse) bool { return len(o.Orders) == 1 })
		if o.Node != name || !strings.HasPrefix(o.Orders[0].Request, "seg-9f2c/"+name+"/") || o.Orders[0].SHA256 != digest {
			t.Fatalf("%s's orders: %+v", name, o)
		}
		own[name] = o.Orders[0]
		if o := orders(n, "?after="+o.Orders[0].Cursor); len(o.Orders) != 0 || o.Next != "" {
			t.Fatalf("after the last cursor: %+v", o)
		}
	}
	// Orders read by another node: there is no way to name one.
	if o := orders(cc, ""); len(o.Orders) != 0 || o.Node != "edge-c" {
		t.Fatalf("edge-c's orders: %+v", o)
	}
	if r := cc.do("GET", "/v1/orders?node=edge-a", nil); r.status != 400 {
		t.Fatalf("orders naming another node: %d %s", r.status, r.body)
	}

	other := pkitest.New(t, "edge-b")
	goodB := signReceipt(t, keyPairOf(t, f.pki, "edge-b"), "edge-b", own["edge-b"])
	for _, h := range []struct {
		name string
		n    *clientT
		line []byte
	}{
		{"another node's receipt", a, goodB},
		{"another CA", b, signReceipt(t, keyPairOf(t, other, "edge-b"), "edge-b", own["edge-b"])},
		// edge-a's own signature, on edge-b's request.
		{"a request ordered to another node", a, signReceipt(t, keyPairOf(t, f.pki, "edge-a"), "edge-a", own["edge-b"])},
	} {
		if r := h.n.do("POST", "/v1/receipts", h.line); r.status != 422 || r.errCode(t) != "receipt_refused" {
			t.Errorf("%s: %d %s", h.name, r.status, r.body)
		}
	}
	status := func() takedowns.Status {
		var st takedowns.Status
		if r := op.do("GET", "/v1/takedowns/"+td.ID, nil); r.status != 200 {
			t.Fatalf("status: %d %s", r.status, r.body)
		} else {
			json.Unmarshal(r.body, &st)
		}
		return st
	}
	if r := a.do("POST", "/v1/receipts", signReceipt(t, keyPairOf(t, f.pki, "edge-a"), "edge-a", own["edge-a"])); r.status != 200 {
		t.Fatalf("edge-a's receipt: %d %s", r.status, r.body)
	}
	poll(t, "edge-a's receipt counted", status, func(s takedowns.Status) bool { return s.ReceiptsVerified == 1 })
	if st := status(); st.Complete || st.Pending != 1 || st.HoldersExpected != 2 {
		t.Fatalf("one of two: %+v", st)
	}
	if r := b.do("POST", "/v1/receipts", goodB); r.status != 200 {
		t.Fatalf("edge-b's receipt: %d %s", r.status, r.body)
	}
	if r := b.do("POST", "/v1/receipts", goodB); r.status != 200 || !strings.Contains(string(r.body), `"replayed":true`) {
		t.Fatalf("edge-b's receipt again: %d %s", r.status, r.body)
	}
	st := poll(t, "complete", status, func(s takedowns.Status) bool { return s.Complete })
	if st.ReceiptsVerified != 2 || st.Pending != 0 {
		t.Fatalf("complete: %+v", st)
	}
	r = op.do("GET", "/v1/takedowns/"+td.ID+"/receipts", nil)
	res, err := takedown.VerifyAll(bytes.NewReader(r.body), caPoolOf(t, f.pki), time.Now())
	if r.header.Get("Content-Type") != api.ReceiptFileType || err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("receipt file: %s %v %+v", r.header.Get("Content-Type"), err, res)
	}
	waitMetrics(t, f.client(t, p, ""), base, f.tokens["reader"], "relay_takedowns_open 1", "relay_takedown_holders_pending 0")

	// The CLI, as the takedown role's principal.
	cli := func(args ...string) string {
		t.Helper()
		args = append(args, "--url", base, "--ca", filepath.Join(f.pki, "ca.crt"),
			"--cert", filepath.Join(f.pki, "td-op.crt"), "--key", filepath.Join(f.pki, "td-op.key"))
		out, err := exec.Command(relayBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("relay %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := cli("takedown", "status", td.ID); !strings.Contains(out, "complete, 2 of 2 receipts verified") || !strings.Contains(out, "edge-b") {
		t.Fatalf("relay takedown status:\n%s", out)
	}
	if out := cli("takedown", "receipts", td.ID); out != string(r.body) {
		t.Fatalf("relay takedown receipts:\n%s\nwant\n%s", out, r.body)
	}
	if out := cli("takedown", "holders", "seg-9f2c"); !strings.Contains(out, "edge-a") || !strings.Contains(out, "held") {
		t.Fatalf("relay takedown holders:\n%s", out)
	}
}

type clientT struct {
	t    *testing.T
	http *http.Client
	base string
}

func (c *clientT) do(method, path string, body []byte, hdr ...string) result {
	c.t.Helper()
	return do(c.t, c.http, method, c.base+path, "", body, hdr...)
}

func caPoolOf(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	p.AddCert(keyPairOfCA(t, dir))
	return p
}

func keyPairOfCA(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	c, _, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(fmt.Errorf("load CA: %w", err))
	}
	return c
}
