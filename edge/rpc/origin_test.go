package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// purgeBackend records purges; the other methods are not reached here.
type purgeBackend struct {
	Backend
	mu     sync.Mutex
	purges int
}

func (b *purgeBackend) PurgeDeadletter(context.Context, Selector) (Deadlettered, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.purges++
	return Deadlettered{Count: 7}, nil
}

func (b *purgeBackend) Status(context.Context) (Status, error) { return Status{NodeID: "n"}, nil }

func (b *purgeBackend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.purges
}

func serve(t *testing.T, spec string, b Backend) net.Listener {
	t.Helper()
	ln, err := Listen(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, nil, nil, ServerOptions{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Shutdown(context.Background())
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln
}

// TestBrowserRequestsRefused: the RPC has no authentication and listens
// on loopback, which a web browser on the same device can reach. A page
// from any site can send a "simple" cross-origin POST (text/plain, no
// preflight), and a DNS-rebound name makes its requests same-origin; both
// must be refused before any backend method runs. edgectl (no Origin,
// loopback Host, or a unix socket) keeps working.
func TestBrowserRequestsRefused(t *testing.T) {
	b := &purgeBackend{}
	ln := serve(t, "127.0.0.1:0", b)
	base := "http://" + ln.Addr().String()
	hc := &http.Client{}
	do := func(method, url, host string, hdr map[string]string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(`{"all":true}`))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, method, path, host string
		hdr                      map[string]string
	}{
		{"cross-site form post", "POST", "/v1/deadletter/purge", "", map[string]string{
			"Content-Type": "text/plain", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}},
		{"cross-origin post, old browser", "POST", "/v1/deadletter/purge", "", map[string]string{
			"Content-Type": "text/plain", "Origin": "https://evil.example"}},
		{"dns rebinding post", "POST", "/v1/deadletter/purge", "evil.example:7401", map[string]string{
			"Content-Type": "text/plain", "Origin": "http://evil.example:7401", "Sec-Fetch-Site": "same-origin"}},
		{"dns rebinding read", "GET", "/v1/status", "evil.example:7401", nil},
	} {
		if code := do(tc.method, base+tc.path, tc.host, tc.hdr); code != http.StatusForbidden {
			t.Errorf("%s: HTTP %d, want 403", tc.name, code)
		}
	}
	if n := b.count(); n != 0 {
		t.Fatalf("%d purges ran for refused requests", n)
	}

	ctx := context.Background()
	for _, spec := range []string{ln.Addr().String(), "localhost:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)} {
		c := NewClient(spec)
		if _, err := c.PurgeDeadletter(ctx, Selector{All: true}); err != nil {
			t.Errorf("edgectl's client via %s refused: %v", spec, err)
		}
		c.Close()
	}
	sock := "unix:" + filepath.Join(t.TempDir(), "rpc.sock")
	serve(t, sock, b)
	c := NewClient(sock)
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Errorf("client over a unix socket refused: %v", err)
	}
	if n := b.count(); n != 2 {
		t.Fatalf("%d purges, want 2", n)
	}
}

// TestDeadletterSelectorRequired: an empty selector used to purge or
// retry everything; now "all" must be said, and not beside an id. The
// backend is not reached for a refused selector.
func TestDeadletterSelectorRequired(t *testing.T) {
	b := &purgeBackend{}
	ln := serve(t, "127.0.0.1:0", b)
	c := NewClient(ln.Addr().String())
	defer c.Close()
	ctx := context.Background()
	for _, sel := range []Selector{{}, {All: true, Peer: "b"}, {All: true, Segment: "s"}} {
		_, err := c.PurgeDeadletter(ctx, sel)
		var re *Error
		if !errors.As(err, &re) || re.Status != http.StatusBadRequest || !strings.Contains(re.Message, "all") {
			t.Errorf("purge %+v: %v, want 400 naming \"all\"", sel, err)
		}
	}
	if n := b.count(); n != 0 {
		t.Fatalf("%d purges ran for refused selectors", n)
	}
	for _, sel := range []Selector{{All: true}, {Peer: "b"}, {Segment: "s"}, {Segment: "s", Peer: "b"}} {
		if _, err := c.PurgeDeadletter(ctx, sel); err != nil {
			t.Errorf("purge %+v: %v", sel, err)
		}
	}
}

// TestMissesAreJSON: a path no route serves (404) and a route asked with
// another method (405, with Allow) answer the documented {"error": ...}
// body, not the mux's plain text.
func TestMissesAreJSON(t *testing.T) {
	ln := serve(t, "127.0.0.1:0", &purgeBackend{})
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"GET", "/v1/nope", http.StatusNotFound, ""},
		{"POST", "/v1/status", http.StatusMethodNotAllowed, "GET"},
	} {
		req, err := http.NewRequest(tc.method, "http://"+ln.Addr().String()+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body ErrorBody
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || derr != nil || body.Error == "" || resp.Header.Get("Content-Type") != "application/json" ||
			!strings.Contains(resp.Header.Get("Allow"), tc.allow) {
			t.Fatalf("%s %s: %d %q (decode %v, Allow %q); want %d with a JSON error", tc.method, tc.path, resp.StatusCode, body.Error, derr, resp.Header.Get("Allow"), tc.code)
		}
	}
}
