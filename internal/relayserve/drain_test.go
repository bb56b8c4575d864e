package relayserve_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/internal/systemdtest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// inFlight reads relay_http_requests_in_flight from /metrics.
func inFlight(t *testing.T, c *http.Client, url, token string) int {
	t.Helper()
	r := do(t, c, "GET", url+"/metrics", token, nil)
	for _, line := range strings.Split(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(line, "relay_http_requests_in_flight "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	t.Fatalf("no in-flight gauge in /metrics: %d", r.status)
	return 0
}

// SIGTERM drains: a request whose body is still arriving when the signal
// comes is served to the end and answered, the process exits 0, and its
// row is delivered (after a restart, if the drain stopped the clock
// before the row's alarm ran).
func TestSigtermDrains(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")

	body := rowsBody("customer-1", "order/1", "drained")
	conn, err := tls.Dial("tcp", p.Addr, servetest.ClientTLS(t, filepath.Join(f.pki, "ca.crt"), "", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /v1/sources/orders/rows HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", p.Addr, f.tokens["producer"], len(body))
	half := len(body) / 2
	if _, err := conn.Write(append([]byte(head), body[:half]...)); err != nil {
		t.Fatal(err)
	}
	// The request is in the handler (reading its body) once the gauge
	// counts it besides the /metrics request asking.
	deadline := time.Now().Add(servetest.StartTimeout)
	for inFlight(t, c, p.URL, f.tokens["reader"]) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the half-sent request never reached the handler")
		}
		time.Sleep(10 * time.Millisecond)
	}

	p.Signal(t, syscall.SIGTERM)
	p.WaitLog(t, "relay serve: draining")
	if _, err := conn.Write(body[half:]); err != nil {
		t.Fatalf("finishing the body after SIGTERM: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("in-flight request not answered: %v", err)
	}
	var enq api.EnqueueResponse
	err = json.NewDecoder(resp.Body).Decode(&enq)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil || len(enq.Seqs) != 1 || enq.Seqs[0] != 1 {
		t.Fatalf("in-flight request during drain: %d %+v %v", resp.StatusCode, enq, err)
	}
	if code := p.Wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	if !strings.Contains(p.Log(), `"forced":false`) {
		t.Fatalf("drain was forced:\n%s", p.Log())
	}

	p = f.start(t)
	c = f.client(t, p, "")
	waitDelivered(t, c, p.URL+"/v1/sources/orders", f.tokens["reader"], 1)
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// --check-config reports every problem of the file and the files it names,
// and exits non-zero; a good file passes.
func TestCheckConfig(t *testing.T) {
	f := newFixture(t, "")
	out, err := exec.Command(relayBin, "serve", "--check-config", "--config", f.cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": ok") {
		t.Fatalf("good config: %v\n%s", err, out)
	}
	bad := servetest.WriteConfig(t, `listen: 0.0.0.0:7480
db: relay.db
tls: {cert: missing.crt, key: missing.key}
auth:
  tokens_file: missing-tokens
  anonymous: {read: true}
budget: {plan: custom, fires_per_alarm: 2}
limit: {}
`)
	out, err = exec.Command(relayBin, "serve", "--check-config", "--config", bad).CombinedOutput()
	if err == nil {
		t.Fatalf("bad config accepted:\n%s", out)
	}
	for _, want := range []string{`line 8: unknown key "limit" (did you mean limits?)`, "line 6: auth.anonymous is allowed only",
		"line 7: budget.rows_per_fire 0", "missing.crt", "missing-tokens"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The files named are checked also when the document is valid.
	noFiles := servetest.WriteConfig(t, "listen: 127.0.0.1:0\ndb: relay.db\ntls: {cert: missing.crt, key: missing.key}\nauth: {tokens_file: missing-tokens}\n")
	out, err = exec.Command(relayBin, "serve", "--check-config", "--config", noFiles).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "missing-tokens") || !strings.Contains(string(out), "missing.crt") {
		t.Fatalf("missing files not reported (%v):\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(noFiles), "relay.db")); err == nil {
		t.Fatal("--check-config created the store")
	}
}

// TestSystemdUnit keeps deploy/relay.service honest: the hardening
// docs/serve.md promises, and flags relay serve really has.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../deploy/relay.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			unit[k] = append(unit[k], v)
		}
	}
	for k, v := range map[string]string{
		"Restart": "on-failure", "KillSignal": "SIGTERM", "ExecReload": "/bin/kill -HUP $MAINPID", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
		"StateDirectory": "relay", "MemoryDenyWriteExecute": "yes",
		// A static user whose group reads /etc/relay (the server key
		// 0640 root:relay); docs/serve.md creates it.
		"User": "relay", "Group": "relay", "ConfigurationDirectory": "relay", "ConfigurationDirectoryMode": "0750",
	} {
		if got := unit[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s=%v, want %q", k, got, v)
		}
	}
	if len(unit["DynamicUser"]) != 0 {
		t.Errorf("DynamicUser=%v: a dynamic user's group cannot be given the key before the first start", unit["DynamicUser"])
	}
	doc, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{
		"useradd --system --user-group --no-create-home --home-dir /var/lib/relay --shell /usr/sbin/nologin relay",
		"install -d -m 0750 -g relay /etc/relay",
	} {
		if !strings.Contains(string(b), step) || !strings.Contains(string(doc), step) {
			t.Errorf("the unit's comment and docs/serve.md do not both give the install step %q", step)
		}
	}
	stop, err := time.ParseDuration(strings.TrimSpace(strings.Join(unit["TimeoutStopSec"], "")))
	if err != nil || stop <= 30*time.Second {
		t.Errorf("TimeoutStopSec=%v must exceed the default drain_timeout (30s)", unit["TimeoutStopSec"])
	}
	for _, key := range []string{"ExecStart", "ExecStartPre"} {
		if len(unit[key]) != 1 {
			t.Fatalf("%s: %v", key, unit[key])
		}
		args := strings.Fields(unit[key][0])[1:]
		for i, a := range args {
			if a == "/etc/relay/relay.yaml" {
				args[i] = "/nonexistent/relay.yaml"
			}
		}
		// Unknown flags fail before the file is read.
		out, _ := exec.Command(relayBin, args...).CombinedOutput()
		if strings.Contains(string(out), "unknown flag") || !strings.Contains(string(out), "/nonexistent/relay.yaml") {
			t.Errorf("%s flags %v: %s", key, args, out)
		}
	}
}

// systemd itself accepts the unit, with relay serve where the unit says
// (here the binary under test). Skipped where systemd-analyze is not
// installed.
func TestSystemdAnalyzeVerify(t *testing.T) {
	systemdtest.Verify(t, "../../deploy/relay.service", "/usr/local/bin/relay", relayBin)
}

// A client that stalls in its body cannot hold a SIGTERM until
// drain_timeout: the drain gives bodies still arriving the first half of
// it, then answers them 503 (nothing written) and exits 0, unforced,
// though limits.read_timeout is far off.
func TestSigtermCutsStalledBody(t *testing.T) {
	dir := t.TempDir()
	cfg := servetest.WriteConfig(t, fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
auth:
  anonymous: {produce: ["*"], read: true}
limits: {read_timeout: 10m}
drain_timeout: 4s
`, filepath.Join(dir, "relay.db")))
	p := servetest.Start(t, relayBin, cfg)
	c := p.Client(nil)

	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/sources/stalled/rows HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"rows\":", p.Addr)
	// The request is reading its body once the gauge counts it besides
	// the /metrics request asking.
	deadline := time.Now().Add(servetest.StartTimeout)
	for inFlight(t, c, p.URL, "") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled request never reached the handler")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Signal(t, syscall.SIGTERM)
	conn.SetReadDeadline(time.Now().Add(servetest.StartTimeout)) // a hang guard
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the stalled request got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte("shutting down")) {
		t.Fatalf("stalled body at SIGTERM: %d %s, want 503 shutting down", resp.StatusCode, body)
	}
	if code := p.Wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM with a stalled client:\n%s", code, p.Log())
	}
	if !strings.Contains(p.Log(), `"forced":false`) {
		t.Fatalf("drain was forced:\n%s", p.Log())
	}
	db := openDB(t, filepath.Join(dir, "relay.db"))
	if _, ok, err := db.Store(relayserve.SourceTable).Get(context.Background(), "stalled", relaycore.KeyOS); err != nil || ok {
		t.Fatalf("the cut request wrote an outbox (%v, %v)", ok, err)
	}
}
