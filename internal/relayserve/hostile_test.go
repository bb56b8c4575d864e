package relayserve_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// logLines parses a server log into its JSON lines with msg.
func logLines(t *testing.T, log, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, sc.Text())
		}
		if line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// A request a web page could make a browser send is refused whatever its
// method: a GET with a foreign Origin or a cross-site Sec-Fetch-Site gets
// 403, the backup included, while API clients (neither header), a
// same-origin request and a person typing the URL (Sec-Fetch-Site: none)
// are served.
func TestCrossOriginRefusedForEveryMethod(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	op := f.tokens["operator"]
	for _, tc := range []struct {
		name, path string
		hdr        []string
		status     int
	}{
		{"backup, foreign origin", "/v1/admin/backup", []string{"Origin", "https://evil.example"}, 403},
		{"state, foreign origin", "/v1/sources/orders/state", []string{"Origin", "https://evil.example"}, 403},
		{"targets, cross-site", "/v1/sources/orders/targets", []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"metrics, same-site", "/metrics", []string{"Sec-Fetch-Site", "same-site"}, 403},
		{"origin null", "/v1/sources/orders/state", []string{"Origin", "null"}, 403},
		{"no browser headers", "/v1/sources/orders/state", nil, 200},
		{"same origin", "/v1/sources/orders/state", []string{"Origin", "https://" + p.Addr}, 200},
		{"typed by a person", "/v1/sources/orders/state", []string{"Sec-Fetch-Site", "none"}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, "GET", p.URL+tc.path, op, nil, tc.hdr...)
			if r.status != tc.status {
				t.Fatalf("%d %.200s; want %d", r.status, r.body, tc.status)
			}
			if tc.status == 403 && r.errCode(t) != "forbidden" {
				t.Fatalf("code %s", r.errCode(t))
			}
		})
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// The routes whose answers carry rows' keys and values (the backup, an
// archive entry, the archive export) need read as well as operate; the
// operator routes that act on targets or list the archive's summaries
// need operate only.
func TestDataRoutesNeedRead(t *testing.T) {
	f := newFixture(t, "  opnoread: {operate: true}\n") // under principals
	tok, line, err := relayserve.MintToken("opnoread")
	if err != nil {
		t.Fatal(err)
	}
	f.tokens["opnoread"] = tok
	tf, err := os.OpenFile(filepath.Join(f.dir, "tokens"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(tf, line); err != nil {
		t.Fatal(err)
	}
	tf.Close()
	p := f.start(t)
	c := f.client(t, p, "")
	src := p.URL + "/v1/sources/orders"
	if r := do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("t1", "k", "secret value")); r.status != 200 {
		t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		path               string
		opNoRead, operator int
	}{
		{"/v1/admin/backup", 403, 200},
		{"/v1/sources/orders/archive/export", 403, 200},
		{"/v1/sources/orders/archive/1", 403, 404}, // no such entry, but the operator may ask
		{"/v1/sources/orders/archive", 200, 200},
		{"/v1/sources/orders/targets", 200, 200},
		{"/v1/sources/orders/targets/t1", 200, 200},
	} {
		r := do(t, c, "GET", p.URL+tc.path, f.tokens["opnoread"], nil)
		if r.status != tc.opNoRead {
			t.Errorf("%s for operate without read: %d %.200s; want %d", tc.path, r.status, r.body, tc.opNoRead)
		}
		if r.status == 403 && !bytes.Contains(r.body, []byte("read role")) {
			t.Errorf("%s: the refusal does not name the read role: %s", tc.path, r.body)
		}
		if bytes.Contains(r.body, []byte("secret value")) {
			t.Errorf("%s showed a row's value to a principal without read", tc.path)
		}
		if r := do(t, c, "GET", p.URL+tc.path, f.tokens["operator"], nil); r.status != tc.operator {
			t.Errorf("%s for operate and read: %d %.200s; want %d", tc.path, r.status, r.body, tc.operator)
		}
	}
	// Acting on a target needs operate only.
	if r := do(t, c, "POST", src+"/targets/t1/pause", f.tokens["opnoread"], []byte(`{"reason":"maintenance"}`)); r.status != 200 {
		t.Errorf("pause for operate without read: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// A refused request's log line says why, as the client was told (an
// unknown token, an expired certificate, a missing role), and never holds
// the token it sent.
func TestRefusalLogSaysWhy(t *testing.T) {
	f := newFixture(t, "")
	if _, err := pki.Issue(f.pki, "expired", pki.Options{Usage: pki.UsageClient, Now: time.Now().Add(-48 * time.Hour), Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	p := f.start(t)
	c := f.client(t, p, "")
	expired := f.client(t, p, "expired")
	const unknown = "relay_0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		client      *http.Client
		token, path string
		status      int
		reason      string
	}{
		{c, unknown, "/v1/sources/why-unknown/state", 401, "unknown bearer token"},
		{expired, "", "/v1/sources/why-expired/state", 401, "expired"},
		{c, f.tokens["producer"], "/v1/sources/why-role/state", 403, `principal "producer" lacks the read role`},
		{c, f.tokens["reader"], "/v1/sources/why-404/nothing", 404, "no route"},
	} {
		if r := do(t, tc.client, "GET", p.URL+tc.path, tc.token, nil); r.status != tc.status {
			t.Fatalf("%s: %d %s; want %d", tc.path, r.status, r.body, tc.status)
		}
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	log := p.Log()
	if strings.Contains(log, unknown) || strings.Contains(log, f.tokens["producer"]) || strings.Contains(log, f.tokens["reader"]) {
		t.Fatal("the log holds a bearer token")
	}
	lines := logLines(t, log, "http request")
	for _, want := range []string{"unknown bearer token", "expired", "lacks the read role", "no route"} {
		found := slices.ContainsFunc(lines, func(l map[string]any) bool {
			r, _ := l["reason"].(string)
			return l["level"] == "WARN" && l["error"] != nil && strings.Contains(r, want)
		})
		if !found {
			t.Errorf("no request log line gives the reason %q:\n%s", want, log)
		}
	}
}

// Enqueues that arrive at once for one source all commit: they take turns
// in the server rather than race on the source's outbox record until
// their re-plans run out (300 at once answered 138 × 503 unavailable).
func TestConcurrentEnqueuesOneSource(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	// HTTP/2 carries the 300 requests, 30 on each of 10 connections
	// opened beforehand, so they reach the server at once (the server
	// allows 32 streams per connection). One client sending 300 at once
	// would dial a connection for each request that finds none free
	// (about 600 dials, most closed unused by the client), fill
	// max_connections with them and have the server close one of its
	// connections for room: what this tests is the enqueue, not the
	// client's dialling (TestLimitListenerClosesOnlyLongIdle tests the
	// listener's choice).
	const conns, perConn = 10, 30
	var clients []*http.Client
	for range conns {
		c := f.client(t, p, "")
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
		if r := do(t, c, "GET", p.URL+"/v1/sources/orders/state", f.tokens["reader"], nil); r.status != 200 {
			t.Fatalf("warm-up: %d %s", r.status, r.body)
		}
		clients = append(clients, c)
	}
	const n = conns * perConn
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		protos   = map[int]int{}
		seqs     []uint64
		errs     []error
	)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", p.URL+"/v1/sources/orders/rows", bytes.NewReader(rowsBody(fmt.Sprintf("t-%d", i%7), fmt.Sprintf("k%d", i), "v")))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+f.tokens["producer"])
			resp, err := clients[i%conns].Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			defer resp.Body.Close()
			statuses[resp.StatusCode]++
			protos[resp.ProtoMajor]++
			var e api.EnqueueResponse
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode == 200 && json.Unmarshal(b, &e) == nil {
				seqs = append(seqs, e.Seqs...)
			}
		})
	}
	wg.Wait()
	t.Logf("%d enqueues at once to one source: %v in %v", n, statuses, time.Since(start))
	if protos[1] > 0 {
		t.Fatalf("requests over HTTP/1.1 (%v): they did not arrive at once", protos)
	}
	if len(errs) > 0 || statuses[200] != n {
		t.Fatalf("statuses %v, errors %v; want %d × 200", statuses, errs, n)
	}
	slices.Sort(seqs)
	if len(seqs) != n || seqs[0] != 1 || seqs[n-1] != n {
		t.Fatalf("seqs %v, want 1..%d once each", seqs, n)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// Certificates and their uses: a node certificate of an edge agent (valid
// for client and server auth, as every certificate edgectl issued before
// it asked for a usage) still authenticates a caller, and a server whose
// tls.cert is a client certificate (not valid for server auth) is refused
// by --check-config with what to do, not left to fail every handshake.
func TestCertificateUsages(t *testing.T) {
	f := newFixture(t, "  edge-node: {read: true}\n")
	pkitest.Issue(t, f.pki, "edge-node", pki.UsageNode)
	p := f.start(t)
	if r := do(t, f.client(t, p, "edge-node"), "GET", p.URL+"/v1/sources/orders/state", "", nil); r.status != 200 {
		t.Fatalf("a node certificate as a client: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	cfg := strings.Replace(f.base, filepath.Join(f.pki, "server.crt"), filepath.Join(f.pki, "certproducer.crt"), 1)
	cfg = strings.Replace(cfg, filepath.Join(f.pki, "server.key"), filepath.Join(f.pki, "certproducer.key"), 1)
	out, err := exec.Command(relayBin, "serve", "--check-config", "--config", servetest.WriteConfig(t, cfg+principalsYAML)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not valid for server auth") || !strings.Contains(string(out), "--usage server") {
		t.Fatalf("--check-config with a client certificate as tls.cert: %v\n%s", err, out)
	}
}

// withLimits is the fixture's configuration with more limits keys.
func (f *fixture) withLimits(t *testing.T, limits string) {
	t.Helper()
	cfg := strings.Replace(f.base, "limits:\n  max_body_bytes: 65536\n", "limits:\n  max_body_bytes: 65536\n"+limits, 1)
	if cfg == f.base {
		t.Fatal("the fixture's limits are not where withLimits looks")
	}
	f.rewrite(t, cfg+principalsYAML)
}

// reused reports whether a request over c reused a connection.
func reused(t *testing.T, c *http.Client, url, token string) bool {
	t.Helper()
	var info httptrace.GotConnInfo
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { info = i },
	}), "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d", url, resp.StatusCode)
	}
	return info.Reused
}

// Idle keep-alive connections cannot hold every slot: with
// max_connections 3 taken by idle connections (and idle_timeout far
// away), a new client is served at once, because the server closes idle
// connections to make room, those that never carried an authenticated
// request first. Before, the new request waited for idle_timeout.
func TestIdleConnectionsDoNotHoldSlots(t *testing.T) {
	f := newFixture(t, "")
	f.withLimits(t, "  max_connections: 3\n  idle_timeout: 10m\n")
	p := f.start(t)
	var probes []*http.Client
	for range 2 { // unauthenticated, as a health probe or an attacker
		c := f.client(t, p, "")
		if r := do(t, c, "GET", p.URL+"/healthz", "", nil); r.status != 200 {
			t.Fatalf("healthz: %d", r.status)
		}
		probes = append(probes, c)
	}
	authed := f.client(t, p, "")
	if reused(t, authed, p.URL+"/v1/sources/orders/state", f.tokens["reader"]) {
		t.Fatal("a new client reused a connection")
	}
	// Every slot is taken by an idle connection.
	late := f.client(t, p, "")
	if r := do(t, late, "GET", p.URL+"/v1/sources/orders/state", f.tokens["reader"], nil); r.status != 200 {
		t.Fatalf("a request at max_connections: %d %s", r.status, r.body)
	}
	// The unauthenticated idle connections made room; the authenticated
	// one is still open.
	if !reused(t, authed, p.URL+"/v1/sources/orders/state", f.tokens["reader"]) {
		t.Error("the idle connection that carried an authenticated request was closed while unauthenticated ones were idle")
	}
	waitMetrics(t, late, p.URL, f.tokens["reader"], "relay_http_idle_connections_closed_total 2")
	for _, c := range probes {
		c.CloseIdleConnections()
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// HTTP/2 does not multiply max_connections: with max_connections 3,
// three requests in flight on one HTTP/2 connection take every slot, and
// a fourth (on any connection) is answered 503 unavailable with
// Retry-After, nothing done, until one of them ends. Before, 301 were in
// flight at once, 300 on one connection.
func TestHTTP2RequestsInFlightBounded(t *testing.T) {
	f := newFixture(t, "")
	f.withLimits(t, "  max_connections: 3\n")
	p := f.start(t)
	tc := servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", "")
	c := &http.Client{Timeout: servetest.StartTimeout, Transport: &http.Transport{
		TLSClientConfig: tc, ForceAttemptHTTP2: true, ExpectContinueTimeout: servetest.StartTimeout,
	}}
	defer c.CloseIdleConnections()
	type flight struct {
		body *io.PipeWriter
		done chan result
	}
	var flights []flight
	for i := range 3 {
		pr, pw := io.Pipe()
		got100 := make(chan struct{})
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got100Continue: func() { close(got100) },
		}), "POST", p.URL+"/v1/sources/orders/rows", pr)
		req.ContentLength = -1
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Expect", "100-continue")
		req.Header.Set("Authorization", "Bearer "+f.tokens["producer"])
		fl := flight{pw, make(chan result, 1)}
		go func() {
			resp, err := c.Do(req)
			if err != nil {
				fl.done <- result{status: -1, body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.ProtoMajor != 2 {
				b = append(b, fmt.Sprintf(" (over %s, want HTTP/2)", resp.Proto)...)
				resp.StatusCode = -2
			}
			fl.done <- result{status: resp.StatusCode, body: b}
		}()
		// The server asks for the body once the handler reads it: the
		// request holds its slot from then until it is answered.
		select {
		case <-got100:
		case r := <-fl.done:
			t.Fatalf("request %d ended before its body was asked for: %d %s", i, r.status, r.body)
		}
		flights = append(flights, fl)
	}
	r := do(t, c, "GET", p.URL+"/v1/sources/orders/state", f.tokens["reader"], nil)
	if r.status != 503 || r.errCode(t) != "unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("a fourth request in flight: %d %s (Retry-After %q); want 503 unavailable with Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	for i, fl := range flights {
		fl.body.Write(rowsBody(fmt.Sprintf("t%d", i), "k", "v"))
		fl.body.Close()
		if r := <-fl.done; r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if r := do(t, c, "GET", p.URL+"/v1/sources/orders/state", f.tokens["reader"], nil); r.status != 200 {
		t.Fatalf("a request once the others ended: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// A busy client's 503 is a warning that says why, not an error.
	refused := slices.DeleteFunc(logLines(t, p.Log(), "http request"), func(l map[string]any) bool { return l["status"] != 503.0 })
	if len(refused) != 1 || refused[0]["level"] != "WARN" || refused[0]["error"] != "unavailable" ||
		!strings.Contains(refused[0]["reason"].(string), "limits.max_connections") {
		t.Fatalf("log lines of the 503: %v", refused)
	}
}

// Failed TLS handshakes, which anyone who can connect causes, are counted
// and summarised in the log instead of one WARN line each.
func TestFailedHandshakesSummarised(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	old := servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", "")
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	const n = 100
	for range n {
		if conn, err := tls.Dial("tcp", p.Addr, old); err == nil {
			conn.Close()
			t.Fatal("a TLS 1.2 handshake succeeded")
		}
	}
	c := f.client(t, p, "")
	waitMetrics(t, c, p.URL, f.tokens["reader"], fmt.Sprintf("relay_tls_handshake_errors_total %d", n))
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	log := p.Log()
	if strings.Contains(log, "TLS handshake error") {
		t.Error("a failed handshake has a log line of its own")
	}
	// One line for the first; a second only if the test ran past a
	// minute.
	if lines := logLines(t, log, "relay serve: TLS handshakes failed"); len(lines) == 0 || len(lines) > 2 {
		t.Errorf("%d summary lines for %d failed handshakes, want 1 (2 past a minute)", len(lines), n)
	}
}

// A target whose name is not UTF-8 (any bytes are a target name; a Go
// program enqueues to it through the engine) is named in relay serve's
// operator routes percent-encoded, and its answers carry the exact bytes
// as target_hex. It was refused 400.
func TestNonUTF8TargetRoutes(t *testing.T) {
	f := newFixture(t, "")
	db, err := bolt.Open(f.db, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&relaycore.RelayHandler{Source: db.Store(relayserve.SourceTable), Clock: relaycore.SystemClock{}}).Enqueue(context.Background(), "orders", []relaycore.Row{{Target: "t\xff", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	p := f.start(t)
	c := f.client(t, p, "")
	op := f.tokens["operator"]
	r := do(t, c, "GET", p.URL+"/v1/sources/orders/targets/t%FF", op, nil)
	var st api.TargetResponse
	if r.status != 200 || json.Unmarshal(r.body, &st) != nil || st.Status.TargetHex != "74ff" {
		t.Fatalf("GET the target t\\xff: %d %s; want 200 with target_hex 74ff", r.status, r.body)
	}
	if r := do(t, c, "POST", p.URL+"/v1/sources/orders/targets/t%FF/pause", op, []byte(`{"reason":"binary name"}`)); r.status != 200 {
		t.Fatalf("pause t\\xff: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// An HTTP/2 connection advertises at most 32 concurrent streams (Go's
// default is 250): read from the server's SETTINGS frame, the first
// frame it sends after the client's preface.
func TestHTTP2StreamsPerConnection(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	tc := servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", "")
	tc.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", p.Addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if proto := conn.ConnectionState().NegotiatedProtocol; proto != "h2" {
		t.Fatalf("negotiated %q, want h2", proto)
	}
	conn.SetDeadline(time.Now().Add(servetest.StartTimeout)) // a hang guard
	// The client preface and an empty SETTINGS frame (RFC 9113 §3.4).
	if _, err := conn.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 9)
	if _, err := io.ReadFull(conn, hdr); err != nil {
		t.Fatal(err)
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	if hdr[3] != 4 || hdr[4]&1 != 0 || n%6 != 0 {
		t.Fatalf("first frame: type %d flags %d length %d, want SETTINGS", hdr[3], hdr[4], n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(conn, payload); err != nil {
		t.Fatal(err)
	}
	streams := -1
	for i := 0; i < n; i += 6 {
		if id := int(payload[i])<<8 | int(payload[i+1]); id == 3 { // SETTINGS_MAX_CONCURRENT_STREAMS
			streams = int(payload[i+2])<<24 | int(payload[i+3])<<16 | int(payload[i+4])<<8 | int(payload[i+5])
		}
	}
	if streams != 32 {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want 32", streams)
	}
}
