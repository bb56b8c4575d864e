package relayserve_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
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
	c := f.client(t, p, "")
	const n = 300
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		seqs     []uint64
		errs     []error
	)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", p.URL+"/v1/sources/orders/rows", bytes.NewReader(rowsBody(fmt.Sprintf("t-%d", i%7), fmt.Sprintf("k%d", i), "v")))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+f.tokens["producer"])
			resp, err := c.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			defer resp.Body.Close()
			statuses[resp.StatusCode]++
			var e api.EnqueueResponse
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode == 200 && json.Unmarshal(b, &e) == nil {
				seqs = append(seqs, e.Seqs...)
			}
		})
	}
	wg.Wait()
	t.Logf("%d enqueues at once to one source: %v in %v", n, statuses, time.Since(start))
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
