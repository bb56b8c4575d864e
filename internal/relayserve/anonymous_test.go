package relayserve_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/relaycore"
)

// Anonymous access on loopback (plain HTTP, the README's laptop setup),
// with targets in a file of their own: rows need no credentials, but a
// wrong token is still refused, and so are what a web page could make a
// browser send (a DNS-rebound Host, a cross-site POST).
func TestAnonymousLoopback(t *testing.T) {
	dir := t.TempDir()
	cfg := servetest.WriteConfig(t, fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
targets: {db: %s}
auth:
  anonymous: {produce: ["*"], read: true, operate: true}
limits: {read_header_timeout: 1s, read_timeout: 2s}
alarms: {sweep_interval: 1s, claim_ttl: 1s}
`, filepath.Join(dir, "relay.db"), filepath.Join(dir, "targets.db")))
	p := servetest.Start(t, relayBin, cfg)
	c := p.Client(nil)
	src := p.URL + "/v1/sources/orders"

	if r := do(t, c, "POST", src+"/rows", "", rowsBody("customer-42", "order/1", "anon")); r.status != 200 {
		t.Fatalf("anonymous enqueue: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		name   string
		token  string
		hdr    []string
		status int
	}{
		{"wrong token", "relay_nope", nil, 401},
		{"rebound host", "", []string{"Host", "evil.example:7480"}, 403},
		{"cross-site browser request", "", []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"foreign origin", "", []string{"Origin", "https://evil.example"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", p.URL+"/v1/sources/refused/rows", bytes.NewReader(rowsBody("t", "k", "v")))
			req.Header.Set("Content-Type", "application/json")
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				if tc.hdr[i] == "Host" {
					req.Host = tc.hdr[i+1]
				} else {
					req.Header.Set(tc.hdr[i], tc.hdr[i+1])
				}
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s; want %d", resp.StatusCode, b, tc.status)
			}
		})
	}
	waitDelivered(t, c, src, "", 1)

	// Slow clients are cut off: one that sends no request line within
	// read_header_timeout, and one that stalls in its body past
	// read_timeout (answered 408 or disconnected).
	idle, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.SetReadDeadline(time.Now().Add(servetest.StartTimeout)) // a hang guard
	if n, err := idle.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a silent connection was kept open (%d bytes, %v)", n, err)
	}
	stall, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	fmt.Fprintf(stall, "POST /v1/sources/stalled/rows HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"rows\":", p.Addr)
	stall.SetReadDeadline(time.Now().Add(servetest.StartTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(stall), nil)
	if err != nil {
		t.Fatalf("a stalled body got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	// The answer says which limit cut the request, not just "i/o timeout".
	if resp.StatusCode != http.StatusRequestTimeout || !bytes.Contains(body, []byte(`"code":"body_incomplete"`)) ||
		!bytes.Contains(body, []byte("limits.read_timeout (2s)")) {
		t.Fatalf("a stalled body got %d %s, want 408 body_incomplete naming limits.read_timeout", resp.StatusCode, body)
	}

	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	ctx := context.Background()
	tdb := openDB(t, filepath.Join(dir, "targets.db"))
	if v, ok, err := tdb.Store(relayserve.TargetTable).Get(ctx, "customer-42", "order/1"); err != nil || !ok || string(v) != "anon" {
		t.Fatalf("targets.db customer-42 order/1 = %q %v %v", v, ok, err)
	}
	db := openDB(t, filepath.Join(dir, "relay.db"))
	if _, ok, err := db.Store(relayserve.TargetTable).Get(ctx, "customer-42", "order/1"); err != nil || ok {
		t.Fatalf("the row landed in the outbox file too (%v, %v)", ok, err)
	}
	for _, s := range []relaycore.Partition{"refused", "stalled"} {
		if _, ok, err := db.Store(relayserve.SourceTable).Get(ctx, s, relaycore.KeyOS); err != nil || ok {
			t.Fatalf("refused source %s has an outbox (%v, %v)", s, ok, err)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// relay serve collects garbage at GOGC=400 unless the environment sets
// GOGC (docs/serve.md, Memory): the runtime's own figure, on /metrics.
func TestServeGCPercent(t *testing.T) {
	for _, tc := range []struct {
		env  string // GOGC; "" unset
		want string
	}{{"", "400"}, {"150", "150"}} {
		t.Run("GOGC="+tc.env, func(t *testing.T) {
			if tc.env == "" {
				if v, ok := os.LookupEnv("GOGC"); ok {
					t.Setenv("GOGC", v) // restored after the test
					os.Unsetenv("GOGC")
				}
			} else {
				t.Setenv("GOGC", tc.env)
			}
			dir := t.TempDir()
			cfg := servetest.WriteConfig(t, fmt.Sprintf("listen: 127.0.0.1:0\ndb: %s\nauth:\n  anonymous: {read: true}\n", filepath.Join(dir, "relay.db")))
			p := servetest.Start(t, relayBin, cfg)
			r := do(t, p.Client(nil), "GET", p.URL+"/metrics", "", nil)
			if r.status != 200 {
				t.Fatalf("/metrics: %d %s", r.status, r.body)
			}
			for _, l := range strings.Split(string(r.body), "\n") {
				if v, ok := strings.CutPrefix(l, "go_gc_gogc_percent "); ok {
					if v != tc.want {
						t.Fatalf("go_gc_gogc_percent %s, want %s", v, tc.want)
					}
					return
				}
			}
			t.Fatalf("no go_gc_gogc_percent on /metrics:\n%s", r.body)
		})
	}
}
