package relaycli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/lambda/api"
)

// serveLog is relay serve's stderr in a test: it keeps the JSON lines
// and hands over the URL of the "listening" line.
type serveLog struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	url   chan string
	found bool
}

func (l *serveLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	var line struct{ Msg, URL string }
	if !l.found && json.Unmarshal(p, &line) == nil && line.Msg == "relay serve: listening" {
		l.found = true
		l.url <- line.URL
	}
	return len(p), nil
}

func (l *serveLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// remoteFixture is a relay serve on 127.0.0.1 with TLS, client
// certificates and bearer tokens, run by the relay command itself
// (`relay serve --config`), and the files its callers need.
type remoteFixture struct {
	url, db, ca string
	// tokens: principal -> file holding its token.
	tokens map[string]string
	// certs: principal -> {cert, key} files.
	certs map[string][2]string
}

// startServe starts the server; it stops (drains) when the test ends.
func startServe(t *testing.T) *remoteFixture {
	t.Helper()
	dir := t.TempDir()
	// A server certificate and a client one, as docs/serve.md issues them.
	pkiDir := pkitest.New(t)
	pkitest.Issue(t, pkiDir, "server", pki.UsageServer)
	pkitest.Issue(t, pkiDir, "ops-cert", pki.UsageClient)
	f := &remoteFixture{db: filepath.Join(dir, "relay.db"), ca: filepath.Join(pkiDir, "ca.crt"),
		tokens: map[string]string{}, certs: map[string][2]string{
			"ops-cert": {filepath.Join(pkiDir, "ops-cert.crt"), filepath.Join(pkiDir, "ops-cert.key")},
		}}
	var lines []string
	for _, p := range []string{"ops", "reader", "producer", "legal"} {
		tok, line, err := relayserve.MintToken(p)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[p] = filepath.Join(dir, p+".token")
		if err := os.WriteFile(f.tokens[p], []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, line)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
db: relay.db
tls: {cert: %s, key: %s, client_ca: %s}
auth: {tokens_file: tokens}
principals:
  ops: {read: true, operate: true}
  ops-cert: {read: true, operate: true}
  reader: {read: true}
  producer: {produce: [orders]}
  legal: {takedown: true}
alarms: {sweep_interval: 1s, claim_ttl: 1s}
`, filepath.Join(pkiDir, "server.crt"), filepath.Join(pkiDir, "server.key"), f.ca)
	cfgPath := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &serveLog{url: make(chan string, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- Run(ctx, []string{"serve", "--config", cfgPath}, &bytes.Buffer{}, logs) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 || t.Failed() {
			t.Logf("relay serve exit %d, log:\n%s", code, logs)
		}
	})
	select {
	case f.url = <-logs.url:
	case code := <-done:
		t.Fatalf("relay serve exited %d before listening:\n%s", code, logs)
	case <-time.After(60 * time.Second): // a hang guard
		t.Fatalf("relay serve not listening:\n%s", logs)
	}
	return f
}

// as returns the --url flags of a principal: its token file, or its
// client certificate.
func (f *remoteFixture) as(principal string) []string {
	args := []string{"--url", f.url, "--ca", f.ca}
	if c, ok := f.certs[principal]; ok {
		return append(args, "--cert", c[0], "--key", c[1])
	}
	return append(args, "--token-file", f.tokens[principal])
}

// enqueue sends rows as the producer, over the same TLS.
func (f *remoteFixture) enqueue(t *testing.T, body string) []uint64 {
	t.Helper()
	srv, err := (&serverFlags{url: f.url, caFile: f.ca, tokenFile: f.tokens["producer"]}).dial()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.serve(t.Context(), api.Request{Method: "POST", Path: "/v1/sources/orders/rows", Body: []byte(body)})
	if err != nil || resp.Status != 200 {
		t.Fatalf("enqueue: %v %d %s", err, resp.Status, resp.Body)
	}
	var res struct{ Seqs []uint64 }
	if err := json.Unmarshal(resp.Body, &res); err != nil {
		t.Fatal(err)
	}
	return res.Seqs
}

// waitFor runs `relay ARGS --json` until check accepts its answer: the
// server's alarm clock delivers (and holds rows) on its own time.
func waitFor[R any](t *testing.T, what string, check func(R) bool, args ...string) R {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a hang guard, not a timing assertion
	for {
		out, _ := cli(t, 0, "", append(args, "--json")...)
		var r R
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		if check(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute; last answer:\n%s", what, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jsonError decodes the --json error object a failed command prints.
func jsonError(t *testing.T, out string) errorJSONDetail {
	t.Helper()
	var e errorJSON
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("stdout is not a JSON error object (%v):\n%s", err, out)
	}
	return e.Error
}

// The runbook against a running relay serve: every operator command with
// --url, over TLS, authenticated by a bearer token or a client
// certificate, the actor recorded being the principal. A stale skip
// prints the API's error as JSON (actual_first included); a principal
// without operate is refused; a locked --db points to --url.
func TestOperatorCommandsAgainstServe(t *testing.T) {
	f := startServe(t)
	ops, opsCert := f.as("ops"), f.as("ops-cert")
	targetArgs := func(verb string, extra ...string) []string {
		return append(append([]string{"target", verb, "--source", "orders"}, extra...), ops...)
	}

	// A target with nothing undelivered, quarantined: nothing is held,
	// so a skip finds nothing and says so.
	f.enqueue(t, rowsBody([3]string{"t1", "k", "v1"}))
	waitFor(t, "t1 delivered", func(r api.TargetResponse) bool { return r.Status.Pending == 0 },
		append([]string{"targets", "show", "--source", "orders", "t1"}, ops...)...)
	out, _ := cli(t, 0, "", targetArgs("quarantine", "t1", "--reason", "refuses order 1")...)
	if !strings.Contains(out, "quarantine: t1 quarantined") || !strings.Contains(out, "quarantine by ops") {
		t.Errorf("quarantine output (the actor is the principal):\n%s", out)
	}
	out, errOut := cli(t, 1, "", targetArgs("skip", "t1", "--expect-first", "1", "--through", "1", "--reason", "x", "--json")...)
	if e := jsonError(t, out); e.Code != "skip_conflict" || e.Status != 409 || e.ActualFirst == nil || *e.ActualFirst != 0 {
		t.Errorf("skip with nothing held: %+v", e)
	}
	if !strings.Contains(errOut, "nothing is held for this target") {
		t.Errorf("skip with nothing held: stderr %s", errOut)
	}

	// Rows for the quarantined target are held by the fires that meet
	// them; the healthy target's row is delivered.
	seqs := f.enqueue(t, rowsBody([3]string{"t1", "k", "poison"}, [3]string{"t1", "k", "v2"}, [3]string{"t2", "k", "ok"}))
	held := waitFor(t, "t1's rows held", func(r api.TargetResponse) bool { return r.Status.Held == 2 },
		append([]string{"targets", "show", "--source", "orders", "t1"}, opsCert...)...)
	if held.Status.HeldFirst != seqs[0] || held.Status.HeldLast != seqs[1] {
		t.Fatalf("held %d..%d, want %d..%d", held.Status.HeldFirst, held.Status.HeldLast, seqs[0], seqs[1])
	}
	out, _ = cli(t, 0, "", append([]string{"targets", "list", "--source", "orders", "--state", "quarantined"}, ops...)...)
	if !strings.Contains(out, "TARGET") || !strings.Contains(out, "t1") || strings.Contains(out, "t2") {
		t.Errorf("targets list:\n%s", out)
	}

	// A stale skip: refused, with the actual first held seq as JSON.
	out, _ = cli(t, 1, "", targetArgs("skip", "t1", "--expect-first", fmt.Sprint(seqs[0]-1), "--through", fmt.Sprint(seqs[0]), "--reason", "x", "--json")...)
	if e := jsonError(t, out); e.Code != "skip_conflict" || e.Status != 409 || e.ActualFirst == nil || *e.ActualFirst != seqs[0] {
		t.Errorf("stale skip: %+v", e)
	}

	// A reader may not act, whatever it may read.
	out, _ = cli(t, 1, "", append([]string{"target", "release", "--source", "orders", "t1", "--json"}, f.as("reader")...)...)
	if e := jsonError(t, out); e.Code != "forbidden" || e.Status != 403 {
		t.Errorf("release as reader: %+v", e)
	}

	// Skip the poison row (client certificate), release (token): the
	// server kicks the alarm and delivers v2.
	out, _ = cli(t, 0, "", append([]string{"target", "skip", "--source", "orders", "t1", "--expect-first", fmt.Sprint(seqs[0]),
		"--through", fmt.Sprint(seqs[0]), "--reason", "order 1: not a number"}, opsCert...)...)
	if !strings.Contains(out, fmt.Sprintf("skipped 1 rows (seqs %d..%d) of t1 into archive entry", seqs[0], seqs[0])) {
		t.Fatalf("skip:\n%s", out)
	}
	cli(t, 0, "", targetArgs("release", "t1", "--reason", "fixed")...)
	waitFor(t, "t1 delivered after the release", func(r api.TargetResponse) bool {
		return r.Status.State == "active" && r.Status.Pending == 0 && r.Status.DeliveredThrough >= seqs[1]
	}, append([]string{"targets", "show", "--source", "orders", "t1"}, ops...)...)

	// The archive: list, export, requeue.
	out, _ = cli(t, 0, "", append([]string{"archive", "list", "--source", "orders"}, ops...)...)
	if !strings.Contains(out, "order 1: not a number") || !strings.Contains(out, "ops-cert") {
		t.Errorf("archive list (the skip's actor is the certificate's principal):\n%s", out)
	}
	out, _ = cli(t, 0, "", append([]string{"archive", "export", "--source", "orders"}, ops...)...)
	var doc api.ArchiveExportResponse
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Entries) != 1 || len(doc.Entries[0].Data) != 1 {
		t.Fatalf("archive export: %v\n%s", err, out)
	}
	id := fmt.Sprint(doc.Entries[0].ID)
	out, _ = cli(t, 0, "", append([]string{"archive", "requeue", "--source", "orders", id}, ops...)...)
	if !strings.Contains(out, "archive entry "+id+" re-enqueued as seqs") {
		t.Errorf("requeue:\n%s", out)
	}

	// The server's file is locked; the error says so, and so does the
	// JSON object, for a script to move to --url.
	out, errOut = cli(t, 1, "", "targets", "list", "--db", f.db, "--source", "orders", "--json")
	if e := jsonError(t, out); e.Code != codeLocked || !strings.Contains(errOut, "take --url") {
		t.Errorf("--db on the server's file: %+v\n%s", e, errOut)
	}
}

// The --url flags refuse what cannot work before sending anything, and a
// server that cannot be reached or trusted is reported as no answer, with
// what to do.
func TestOperatorURLRefusals(t *testing.T) {
	f := startServe(t)
	for _, tc := range []struct {
		args []string
		code string
		want string
	}{
		{[]string{"target", "pause", "--source", "orders", "t1", "--by", "alice", "--url", f.url}, codeUsage, "--by does not go with --url"},
		{[]string{"targets", "list", "--source", "orders", "--db", "x.db", "--url", f.url}, codeUsage, "--db does not go with --url"},
		{[]string{"targets", "list", "--source", "orders", "--token-file", "tok"}, codeUsage, "go with --url"},
		{[]string{"targets", "list", "--source", "orders", "--url", "127.0.0.1:7480"}, codeUsage, "want the server's base URL"},
		{[]string{"targets", "list", "--source", "orders", "--url", f.url, "--cert", "c.crt"}, codeUsage, "--cert and --key go together"},
		{[]string{"targets", "list", "--source", "orders", "--url", f.url, "--cert", "c.crt", "--key", "c.key", "--token-file", "tok"}, codeUsage, "give one credential"},
		{[]string{"targets", "list", "--url", f.url}, codeUsage, "--source is required"},
		{[]string{"targets", "show", "--source", "orders", "--url", f.url}, codeUsage, "accepts 1 arg"},
		{[]string{"targets", "list", "--source", "orders", "--bogus"}, codeUsage, "unknown flag"},
		// The system does not trust the test CA.
		{[]string{"targets", "list", "--source", "orders", "--url", f.url, "--token-file", f.tokens["ops"]}, codeNoAnswer, "give --ca"},
		{[]string{"targets", "list", "--source", "orders", "--url", closedURL(t), "--ca", f.ca}, codeNoAnswer, "no answer from"},
		// Authenticated, but not as anyone the server knows.
		{[]string{"targets", "list", "--source", "orders", "--url", f.url, "--ca", f.ca}, "unauthenticated", "401"},
	} {
		out, errOut := cli(t, 1, "", append(tc.args, "--json")...)
		if e := jsonError(t, out); e.Code != tc.code || !strings.Contains(errOut, tc.want) || e.MaybeApplied {
			t.Errorf("%v: %+v\nstderr: %s", tc.args, e, errOut)
		}
	}
}

// closedURL is an https URL on 127.0.0.1 where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "https://" + addr
}

// An action whose request was sent in full but got no answer may have
// been applied, and the error says so; one refused before it was sent
// (above: a closed port, an untrusted certificate) says nothing of the
// kind.
func TestNoAnswerAfterSendMayBeApplied(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// Read the whole request, then hang up without answering.
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err == nil {
					io.Copy(io.Discard, req.Body)
				}
			}()
		}
	}()
	out, errOut := cli(t, 1, "", "target", "pause", "--source", "orders", "t1", "--url", "http://"+l.Addr().String(), "--json")
	if e := jsonError(t, out); e.Code != codeNoAnswer || !e.MaybeApplied || !strings.Contains(errOut, "may have been applied") {
		t.Errorf("%+v\nstderr: %s", e, errOut)
	}
}

// relay takedown request with --idempotency-key may be run again after a
// lost answer: the second run answers the takedown the first opened
// (once the relay has delivered its record), marked replayed; the key
// with another reason is refused with the API's code.
func TestTakedownRequestIdempotencyKey(t *testing.T) {
	f := startServe(t)
	legal := f.as("legal")
	args := append([]string{"takedown", "request", "seg-9f2c", "--reason", "dmca 2026-118", "--idempotency-key", "dmca-2026-118"}, legal...)
	out, _ := cli(t, 0, "", append(args, "--json")...)
	var first api.TakedownResponse
	if err := json.Unmarshal([]byte(out), &first); err != nil || first.ID == "" || first.Replayed || first.IdempotencyKey != "dmca-2026-118" {
		t.Fatalf("first request: %v\n%s", err, out)
	}
	// Until the relay has delivered the first run's record, a second run
	// says takedown_pending (exit 1); then it answers.
	var again api.TakedownResponse
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) { // a hang guard
		var out, errb bytes.Buffer
		code := RunWithInput(t.Context(), append(args, "--json"), strings.NewReader(""), &out, &errb)
		if code == 0 {
			if err := json.Unmarshal(out.Bytes(), &again); err != nil {
				t.Fatalf("run again: %v\n%s", err, out.String())
			}
			break
		}
		if e := jsonError(t, out.String()); e.Code != "takedown_pending" || time.Now().After(deadline) {
			t.Fatalf("run again: exit %d, %+v", code, e)
		}
	}
	if again.ID != first.ID || !again.Replayed {
		t.Fatalf("run again: %+v, want takedown %s replayed", again, first.ID)
	}
	out, _ = cli(t, 0, "", args...)
	if !strings.Contains(out, "takedown "+first.ID) || !strings.Contains(out, "nothing new was written") {
		t.Errorf("run again, text:\n%s", out)
	}
	out, _ = cli(t, 1, "", append([]string{"takedown", "request", "seg-9f2c", "--reason", "another", "--idempotency-key", "dmca-2026-118", "--json"}, legal...)...)
	if e := jsonError(t, out); e.Code != "idempotency_key_reused" || e.Status != 409 {
		t.Errorf("the key with another reason: %+v", e)
	}
}
