package relayserve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// relayBin is the relay binary under test, built once in TestMain.
var relayBin string

// The PostgreSQL cluster of the store tests (pgtest) starts on first use
// and stops after the tests.
func TestMain(m *testing.M) { os.Exit(pgtest.After(servetest.Main(m, &relayBin))) }

// fixture is a server configuration with TLS, client certificates and
// tokens, and the credentials of its principals.
type fixture struct {
	dir, pki string
	db       string
	tokens   map[string]string // principal -> token
	cfgPath  string
	// base is the configuration file without its principals (and
	// extra), for tests that rewrite the file and reload it.
	base string
}

// principals: producer may produce to orders; reader reads; operator
// operates and reads; nobody has a token but no roles.
const principalsYAML = `
principals:
  producer: {produce: [orders, "tenant/42"]}
  reader: {read: true}
  operator: {read: true, operate: true}
  certproducer: {produce: [orders], read: true}
  roleless: {}
`

func newFixture(t testing.TB, extra string) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir(), tokens: map[string]string{}}
	f.pki = pkitest.New(t)
	pkitest.Issue(t, f.pki, "server", pki.UsageServer)
	for _, c := range []string{"certproducer", "stranger"} {
		pkitest.Issue(t, f.pki, c, pki.UsageClient)
	}
	f.db = filepath.Join(f.dir, "relay.db")
	var lines []string
	for _, p := range []string{"producer", "reader", "operator", "roleless"} {
		tok, line, err := relayserve.MintToken(p)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[p] = tok
		lines = append(lines, line)
	}
	tokensFile := filepath.Join(f.dir, "tokens")
	if err := os.WriteFile(tokensFile, []byte("# principal digest\n"+strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
tls:
  cert: %s
  key: %s
  client_ca: %s
auth:
  tokens_file: %s
alarms:
  sweep_interval: 1s
  claim_ttl: 1s
limits:
  max_body_bytes: 65536
drain_timeout: 20s
log_level: debug
`, f.db, filepath.Join(f.pki, "server.crt"), filepath.Join(f.pki, "server.key"), filepath.Join(f.pki, "ca.crt"), tokensFile)
	f.base = cfg
	f.cfgPath = servetest.WriteConfig(t, cfg+principalsYAML+extra)
	return f
}

// rewrite replaces the configuration file's content with yaml (for a
// reload).
func (f *fixture) rewrite(t *testing.T, yaml string) {
	t.Helper()
	if err := os.WriteFile(f.cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) start(t *testing.T) *servetest.Proc {
	t.Helper()
	return servetest.Start(t, relayBin, f.cfgPath)
}

// client trusts the fixture's CA and presents cert (a certificate in f.pki) if
// not "".
func (f *fixture) client(t testing.TB, p *servetest.Proc, cert string) *http.Client {
	t.Helper()
	if cert == "" {
		return p.Client(servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", ""))
	}
	return p.Client(servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), filepath.Join(f.pki, cert+".crt"), filepath.Join(f.pki, cert+".key")))
}

type result struct {
	status int
	body   []byte
	header http.Header
}

func (r result) errCode(t *testing.T) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("status %d, body %q is not an error body: %v", r.status, r.body, err)
	}
	return e.Error.Code
}

// do sends one request; token "" sends none.
func do(t testing.TB, c *http.Client, method, url, token string, body []byte, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == nil {
		req.Body = nil
	}
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{resp.StatusCode, b, resp.Header}
}

func rowsBody(target string, kvs ...string) []byte {
	var rows []api.RowJSON
	for i := 0; i+1 < len(kvs); i += 2 {
		v := base64.StdEncoding.EncodeToString([]byte(kvs[i+1]))
		rows = append(rows, api.RowJSON{Target: target, Puts: []api.PutJSON{{Key: kvs[i], Value: &v}}})
	}
	b, _ := json.Marshal(api.EnqueueRequest{Rows: rows})
	return b
}

// waitDelivered polls delivered-through until seq is delivered; the
// deadline guards against a hang.
func waitDelivered(t testing.TB, c *http.Client, url, token string, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(servetest.StartTimeout)
	for {
		r := do(t, c, "GET", fmt.Sprintf("%s/delivered-through?seq=%d", url, seq), token, nil)
		if r.status != 200 {
			t.Fatalf("delivered-through: %d %s", r.status, r.body)
		}
		var d struct{ Delivered bool }
		json.Unmarshal(r.body, &d)
		if d.Delivered {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("seq %d of %s not delivered within %v", seq, url, servetest.StartTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMetrics polls /metrics until it holds every line; the deadline
// guards against a hang.
func waitMetrics(t *testing.T, c *http.Client, url, token string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(servetest.StartTimeout)
	for {
		r := do(t, c, "GET", url+"/metrics", token, nil)
		missing := ""
		for _, w := range want {
			if !strings.Contains(string(r.body), w) {
				missing = w
				break
			}
		}
		if r.status == 200 && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %q after %v: %d\n%s", missing, servetest.StartTimeout, r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openDB opens the (stopped) server's bbolt file.
func openDB(t *testing.T, path string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Check(); err != nil {
			t.Error(err)
		}
		db.Close()
	})
	return db
}

// Rows enqueued over HTTPS with a token and with a client certificate are
// delivered to their target partitions; the read routes and the metrics
// say so.
func TestEnqueueDeliverQuery(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	src := p.URL + "/v1/sources/orders"

	r := do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("customer-42", "order/1", "one", "order/2", "two"), "Idempotency-Key", "batch-1")
	if r.status != 200 {
		t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	var enq api.EnqueueResponse
	if err := json.Unmarshal(r.body, &enq); err != nil || len(enq.Seqs) != 2 || enq.Seqs[1] != 2 {
		t.Fatalf("enqueue answer %s (%v)", r.body, err)
	}
	// The retry of a batch whose answer was lost replays it.
	r = do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("customer-42", "order/1", "one", "order/2", "two"), "Idempotency-Key", "batch-1")
	if r.status != 200 || !strings.Contains(string(r.body), `"replayed":true`) {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	// A client certificate authenticates as its node id.
	cc := f.client(t, p, "certproducer")
	r = do(t, cc, "POST", src+"/rows", "", rowsBody("customer-7", "order/3", "three"))
	if r.status != 200 || !strings.Contains(string(r.body), `"seqs":[3]`) {
		t.Fatalf("enqueue with a client certificate: %d %s", r.status, r.body)
	}
	// An encoded '/' in a source id is one segment, and the role names the
	// decoded id.
	r = do(t, c, "POST", p.URL+"/v1/sources/tenant%2F42/rows", f.tokens["producer"], rowsBody("t", "k", "v"))
	if r.status != 200 {
		t.Fatalf("enqueue to tenant/42: %d %s", r.status, r.body)
	}

	waitDelivered(t, c, src, f.tokens["reader"], 3)
	r = do(t, c, "GET", src+"/state", f.tokens["reader"], nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"empty":true`) {
		t.Fatalf("state: %d %s", r.status, r.body)
	}
	r = do(t, c, "GET", src+"/targets", f.tokens["operator"], nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"targets":`) {
		t.Fatalf("targets: %d %s", r.status, r.body)
	}
	// Any token is a method to HTTP; the metrics label it "other".
	if r := do(t, c, "BREW", src+"/rows", f.tokens["producer"], nil); r.status != 405 {
		t.Fatalf("BREW: %d %s", r.status, r.body)
	}
	// An alarm's metrics are recorded after its rows are visible as
	// delivered, so the figures are awaited.
	waitMetrics(t, c, p.URL, f.tokens["reader"],
		`relay_http_requests_total{code="405",method="other",route="unmatched"} 1`,
		`relay_rows_delivered_total{source="orders"} 3`,
		`relay_http_requests_total{code="200",method="POST",route="/v1/sources/{source}/rows"}`,
		`relay_oldest_undelivered_age_seconds{source="orders"} 0`,
		`relay_sweeps_total`)
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := do(t, c, "GET", p.URL+path, "", nil); r.status != 200 {
			t.Fatalf("%s without credentials: %d %s", path, r.status, r.body)
		}
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}

	db := openDB(t, f.db)
	for _, kv := range [][3]string{{"customer-42", "order/1", "one"}, {"customer-42", "order/2", "two"}, {"customer-7", "order/3", "three"}} {
		v, ok, err := db.Store(relayserve.TargetTable).Get(context.Background(), relaycore.Partition(kv[0]), kv[1])
		if err != nil || !ok || string(v) != kv[2] {
			t.Fatalf("target %s key %s = %q, %v, %v; want %q", kv[0], kv[1], v, ok, err, kv[2])
		}
	}
}

// Bad credentials, wrong roles, oversize bodies and malformed JSON get a
// clear 4xx, and nothing is written: every refused request names its own
// source, and after the server stops none of those sources has an outbox.
func TestRefusals(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	stranger := f.client(t, p, "stranger")         // signed by the same CA, but no principal
	certProducer := f.client(t, p, "certproducer") // may produce to orders only
	otherCA := newFixture(t, "")                   // a CA the server does not trust
	foreign := p.Client(servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), filepath.Join(otherCA.pki, "certproducer.crt"), filepath.Join(otherCA.pki, "certproducer.key")))
	big := rowsBody("t", "k", strings.Repeat("x", 70000)) // over the 65536-byte limit
	var refusedSources []string
	for _, tc := range []struct {
		name   string
		client *http.Client
		token  string
		method string
		source string // each case its own source; "" for read routes on orders
		path   string // after /v1/sources/<source>
		body   []byte
		hdr    []string
		status int
		code   string
	}{
		{"no credentials", c, "", "POST", "r-none", "/rows", rowsBody("t", "k", "v"), nil, 401, "unauthenticated"},
		{"unknown token", c, "relay_0000", "POST", "r-token", "/rows", rowsBody("t", "k", "v"), nil, 401, "unauthenticated"},
		{"not a bearer token", c, "", "POST", "r-basic", "/rows", rowsBody("t", "k", "v"), []string{"Authorization", "Basic dTpw"}, 401, "unauthenticated"},
		{"certificate of another CA", foreign, "", "POST", "r-foreign", "/rows", rowsBody("t", "k", "v"), nil, 401, "unauthenticated"},
		{"certificate and token", certProducer, f.tokens["producer"], "POST", "r-both", "/rows", rowsBody("t", "k", "v"), nil, 401, "unauthenticated"},
		{"certificate without principal", stranger, "", "POST", "r-stranger", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"token without roles", c, f.tokens["roleless"], "POST", "r-roleless", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"producer, other source", c, f.tokens["producer"], "POST", "r-other", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"certificate, other source", certProducer, "", "POST", "r-certother", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"reader enqueues", c, f.tokens["reader"], "POST", "r-reader", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"operator enqueues", c, f.tokens["operator"], "POST", "r-operator", "/rows", rowsBody("t", "k", "v"), nil, 403, "forbidden"},
		{"producer reads", c, f.tokens["producer"], "GET", "orders", "/state", nil, nil, 403, "forbidden"},
		{"producer operates", c, f.tokens["producer"], "POST", "orders", "/targets/t/pause", []byte(`{}`), nil, 403, "forbidden"},
		{"reader operates", c, f.tokens["reader"], "POST", "orders", "/targets/t/quarantine", []byte(`{}`), nil, 403, "forbidden"},
		{"reader lists targets", c, f.tokens["reader"], "GET", "orders", "/targets", nil, nil, 403, "forbidden"},
		{"oversize body", c, f.tokens["producer"], "POST", "orders", "/rows", big, nil, 413, "too_large"},
		{"malformed JSON", c, f.tokens["producer"], "POST", "orders", "/rows", []byte(`{"rows":[{"target":"t",`), nil, 400, "bad_request"},
		{"unknown field", c, f.tokens["producer"], "POST", "orders", "/rows", []byte(`{"rows":[],"extra":1}`), nil, 400, "bad_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.client, tc.method, p.URL+"/v1/sources/"+tc.source+tc.path, tc.token, tc.body, tc.hdr...)
			if r.status != tc.status || r.errCode(t) != tc.code {
				t.Fatalf("%d %s; want %d %s", r.status, r.body, tc.status, tc.code)
			}
			if tc.status == 401 && r.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
		if tc.source != "orders" {
			refusedSources = append(refusedSources, tc.source)
		}
	}
	// A chunked body (no Content-Length) over the limit is cut and refused too.
	req, _ := http.NewRequest("POST", p.URL+"/v1/sources/orders/rows", io.MultiReader(bytes.NewReader(big)))
	req.Header.Set("Authorization", "Bearer "+f.tokens["producer"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || req.ContentLength != 0 {
		t.Fatalf("chunked oversize body: %d (content length %d)", resp.StatusCode, req.ContentLength)
	}
	// TLS 1.3 only: a client that stops at 1.2 gets no connection.
	old := servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", "")
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if conn, err := tls.Dial("tcp", p.Addr, old); err == nil {
		conn.Close()
		t.Fatal("a TLS 1.2 handshake succeeded")
	}
	// /metrics needs the read role.
	if r := do(t, c, "GET", p.URL+"/metrics", f.tokens["producer"], nil); r.status != 403 {
		t.Fatalf("metrics for a producer: %d", r.status)
	}
	if r := do(t, c, "GET", p.URL+"/metrics", "", nil); r.status != 401 {
		t.Fatalf("metrics without credentials: %d", r.status)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	db := openDB(t, f.db)
	for _, s := range append(refusedSources, "orders") {
		_, found, err := db.Store(relayserve.SourceTable).Get(context.Background(), relaycore.Partition(s), relaycore.KeyOS)
		if err != nil || found {
			t.Errorf("source %q has an outbox after refused requests (found %v, %v)", s, found, err)
		}
	}
	if err := db.Check(); err != nil {
		t.Fatal(err)
	}
}

// reloadFailed is the log message of a refused reload.
const reloadFailed = "relay serve: reload failed; the configuration and credentials in use stay"

// SIGHUP reloads the tokens file and the server certificate: a new token
// works at once and a removed one is refused, new connections get the
// new certificate, without a restart; a broken file is refused and the
// credentials in use stay.
func TestReloadTokens(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	src := p.URL + "/v1/sources/orders"
	tokensFile := filepath.Join(f.dir, "tokens")

	newTok, line, err := relayserve.MintToken("producer")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokensFile, []byte("producer "+strings.Fields(line)[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Issue(f.pki, "server", pki.Options{Usage: pki.UsageServer, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGHUP)
	p.WaitLog(t, "relay serve: reloaded")
	served := serverCert(t, p.Addr, servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", ""))
	onDisk, err := tls.LoadX509KeyPair(filepath.Join(f.pki, "server.crt"), filepath.Join(f.pki, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served.Raw, onDisk.Certificate[0]) {
		t.Fatal("new connections still get the certificate from before the reload")
	}
	if r := do(t, c, "POST", src+"/rows", newTok, rowsBody("t", "k", "v")); r.status != 200 {
		t.Fatalf("new token after reload: %d %s", r.status, r.body)
	}
	if r := do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("t", "k", "v")); r.status != 401 {
		t.Fatalf("removed token after reload: %d %s", r.status, r.body)
	}

	if err := os.WriteFile(tokensFile, []byte("producer sha256:nothex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGHUP)
	p.WaitLog(t, reloadFailed)
	if r := do(t, c, "POST", src+"/rows", newTok, rowsBody("t", "k", "v")); r.status != 200 {
		t.Fatalf("token in use after a failed reload: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// serverCert is the certificate a new TLS connection to addr gets.
func serverCert(t *testing.T, addr string, tc *tls.Config) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}
