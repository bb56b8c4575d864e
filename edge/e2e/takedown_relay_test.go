package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/relayserve/servetest"
)

// relayBin is cmd/relay, built once for the tests that run relay serve.
var relayBin struct {
	once sync.Once
	path string
	err  error
}

func relayBinary(t testing.TB) string {
	t.Helper()
	relayBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "edge-e2e-relay-")
		if err != nil {
			relayBin.err = err
			return
		}
		relayBin.path, relayBin.err = servetest.Build(dir)
	})
	if relayBin.err != nil {
		t.Fatal(relayBin.err)
	}
	return relayBin.path
}

// takedownStatus is what the test reads of GET /v1/takedowns/{id}.
type takedownStatus struct {
	ID               string `json:"id"`
	Complete         bool   `json:"complete"`
	HoldersExpected  int    `json:"holders_expected"`
	ReceiptsVerified int    `json:"receipts_verified"`
	Waived           int    `json:"waived"`
	Holders          []struct {
		Node         string `json:"node"`
		State        string `json:"state"`
		LastReportMS int64  `json:"last_report_ms"`
	} `json:"holders"`
}

func (s takedownStatus) holder(node string) string {
	for _, h := range s.Holders {
		if h.Node == node {
			return h.State
		}
	}
	return ""
}

// TestTakedownThreeHolders is issue 23's proof with real processes: relay
// serve (the takedown owner, over mutual TLS) and three edged. a ingests
// seg-1 and relays it to b; both report it. b goes offline; the takedown
// is requested (a and b are its holders); a is killed (SIGKILL, at the
// fault point kill-unindex) right after its eviction committed and before
// anything was posted, and restarted. c starts, and b comes back unable to
// reach the relay (its uplink down, its link to c up) and relays seg-1 to
// c: c is a late holder, reports it, is ordered and evicts. Then b reaches
// the relay again, pulls its order and evicts. The takedown is complete
// only once all three receipts are verified, never before; the exported
// receipt file verifies with the CA alone; and seg-1 is refused on every
// node when offered again.
func TestTakedownThreeHolders(t *testing.T) {
	cl := newCluster(t, "a", "b", "c")
	a, b, c := cl.nodes["a"], cl.nodes["b"], cl.nodes["c"]
	a.peers, b.peers, c.peers = []string{"b"}, []string{"a", "c"}, []string{"b"}
	relay, call := startTakedownRelay(t, cl, "  claim_ttl: 1s\nlog_level: debug\n", false)
	apiConfig := func(url string) string {
		return fmt.Sprintf("  url: %s\n  ca: pki/ca.crt\n  report_interval: 100ms\n  order_interval: 100ms\n  backoff: {initial: 50ms, max: 200ms}\n", url)
	}
	unreachable := "https://" + freePort(t) // nothing listens there
	a.relayAPI, b.relayAPI, c.relayAPI = apiConfig(relay.URL), apiConfig(relay.URL), apiConfig(relay.URL)
	a.faults = filepath.Join(cl.dir, "a-faults")

	a.start()
	b.start()
	seg := bytes.Repeat([]byte("takedown "), 9000)
	putFile(t, a, "seg-1", seg)
	eventually(t, "seg-1 at b", func() bool { return b.has("seg-1", digest(seg)) })
	eventually(t, "a and b indexed as holders", func() bool {
		var h struct {
			Holders []struct{ Node, State string } `json:"holders"`
		}
		json.Unmarshal(call("GET", "/v1/holdings/seg-1", nil), &h)
		held := 0
		for _, x := range h.Holders {
			if x.State == "held" && (x.Node == "a" || x.Node == "b") {
				held++
			}
		}
		return held == 2
	})
	b.stop() // offline during the request

	if err := os.WriteFile(a.faults, []byte("kill-unindex"), 0o600); err != nil {
		t.Fatal(err)
	}
	var td struct {
		ID      string   `json:"id"`
		Holders []string `json:"holders"`
	}
	if err := json.Unmarshal(call("POST", "/v1/takedowns", []byte(`{"content_id":"seg-1","reason":"dmca 2026-118"}`)), &td); err != nil || len(td.Holders) != 2 {
		t.Fatalf("takedown %+v: %v", td, err)
	}
	// status reads the takedown and checks the invariant of every read:
	// complete only with every expected holder's receipt verified.
	status := func() takedownStatus {
		t.Helper()
		var s takedownStatus
		if err := json.Unmarshal(call("GET", "/v1/takedowns/"+td.ID, nil), &s); err != nil {
			t.Fatal(err)
		}
		if s.Complete && (s.ReceiptsVerified+s.Waived != s.HoldersExpected || s.ReceiptsVerified < 3) {
			t.Fatalf("takedown reported complete early: %+v", s)
		}
		return s
	}
	a.mu.Lock()
	done := a.waitDone
	a.mu.Unlock()
	select {
	case <-done: // a killed itself right after its eviction committed
	case <-time.After(waitFor):
		t.Fatal("a did not reach the fault point")
	}
	a.kill()
	if s := status(); s.Complete || s.ReceiptsVerified != 0 {
		t.Fatalf("after a's kill: %+v", s)
	}
	if err := os.WriteFile(a.faults, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.start()
	eventually(t, "a's receipt verified", func() bool { return status().holder("a") == "evicted" })
	if s := status(); s.Complete || s.holder("b") != "pending" {
		t.Fatalf("with b offline: %+v", s)
	}

	c.start()
	b.relayAPI = apiConfig(unreachable)
	b.start()
	eventually(t, "seg-1 relayed from b to c after the request", func() bool { return c.has("seg-1", digest(seg)) })
	eventually(t, "c, a late holder, evicted with a verified receipt", func() bool { return status().holder("c") == "evicted" })
	if c.has("seg-1", digest(seg)) {
		t.Fatal("c still holds seg-1")
	}
	s := status()
	if s.Complete || s.holder("b") != "pending" || s.HoldersExpected != 3 {
		t.Fatalf("with b unable to reach the relay: %+v", s)
	}
	for _, h := range s.Holders {
		if h.Node == "b" && h.LastReportMS == 0 {
			t.Fatalf("b pending without its last report time: %+v", s)
		}
	}

	b.stop()
	b.relayAPI = apiConfig(relay.URL)
	b.start()
	eventually(t, "complete", func() bool { return status().Complete })
	if s := status(); s.ReceiptsVerified != 3 || s.HoldersExpected != 3 || s.Waived != 0 {
		t.Fatalf("complete: %+v", s)
	}
	if b.has("seg-1", digest(seg)) {
		t.Fatal("b still holds seg-1")
	}

	file := filepath.Join(t.TempDir(), "receipts.jsonl")
	if err := os.WriteFile(file, call("GET", "/v1/takedowns/"+td.ID+"/receipts", nil), 0o600); err != nil {
		t.Fatal(err)
	}
	out := edgectl(t, "", "takedown", "verify", file, "--ca", filepath.Join(cl.dir, "pki", "ca.crt")) // exit 0: every line verifies
	for _, n := range []string{"a", "b", "c"} {
		if !regexp.MustCompile(`(?m)^line \d+\s+ok\s+request seg-1/` + n + `/\d{19}: node ` + n + ` evicted seg-1 \(sha256 ` + digest(seg) + `\)`).MatchString(out) {
			t.Errorf("receipt file: no verified receipt of %s:\n%s", n, out)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^line \d+\s`).FindAllString(out, -1)); n != 3 {
		t.Fatalf("receipt file: %d receipts, want 3:\n%s", n, out)
	}
	for _, n := range []*node{a, b, c} {
		path := filepath.Join(t.TempDir(), "seg-1")
		if err := os.WriteFile(path, seg, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, code := edgectlCode(t, n.rpc, "segment", "put", path); code == 0 {
			t.Fatalf("%s took seg-1 again:\n%s", n.id, out)
		}
		if n.has("seg-1", digest(seg)) {
			t.Fatalf("%s holds seg-1 again", n.id)
		}
	}
}

// startTakedownRelay starts relay serve for the takedown tests: bbolt in
// cl's directory, mutual TLS with a server certificate from cl's CA, the
// sweep every second, the takedown operator td-op and holders a, b and c;
// extra is appended under alarms: (its first lines; a line without the
// indent starts a top-level key). call is td-op's request: the body of a
// 200, and a fatal error for any other answer, except that a 503
// takedown_pending (the takedown's record is still on its way to its
// partition) answers nil when pendingOK is set.
func startTakedownRelay(tb testing.TB, cl *cluster, extra string, pendingOK bool) (*servetest.Proc, func(method, path string, body []byte) []byte) {
	tb.Helper()
	pkiDir := filepath.Join(cl.dir, "pki")
	edgectl(tb, "", "pki", "issue", "relay", "--usage", "server", "--dir", pkiDir)
	edgectl(tb, "", "pki", "issue", "td-op", "--usage", "client", "--dir", pkiDir)
	ca := filepath.Join(pkiDir, "ca.crt")
	relay := servetest.Start(tb, relayBinary(tb), servetest.WriteConfig(tb, fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
tls:
  cert: %s
  key: %s
  client_ca: %s
principals:
  td-op: {takedown: true}
  a: {hold: true}
  b: {hold: true}
  c: {hold: true}
alarms:
  sweep_interval: 1s
%s`, filepath.Join(cl.dir, "relay.db"), filepath.Join(pkiDir, "relay.crt"), filepath.Join(pkiDir, "relay.key"), ca, extra)))
	op := relay.Client(servetest.ClientTLS(tb, ca, filepath.Join(pkiDir, "td-op.crt"), filepath.Join(pkiDir, "td-op.key")))
	call := func(method, path string, body []byte) []byte {
		tb.Helper()
		req, _ := http.NewRequest(method, relay.URL+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := op.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if pendingOK && resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(out, []byte(`"takedown_pending"`)) {
			return nil
		}
		if resp.StatusCode != http.StatusOK {
			tb.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
		}
		return out
	}
	return relay, call
}

// TestTakedownLateHolderReportedOnStore: a node that stores a segment after
// its takedown was requested (a late holder) reports it soon after the
// store, not at its next relay_api.report_interval: the interval is an hour
// here, so only the store's signal (relay_api.report_delay, the default)
// can send the report. The owner then sees the late holder, orders it, and
// the takedown completes with its receipt; it is never complete while a
// holds the segment.
func TestTakedownLateHolderReportedOnStore(t *testing.T) {
	cl := newCluster(t, "a")
	a := cl.nodes["a"]
	relay, call := startTakedownRelay(t, cl, "", true)
	a.relayAPI = fmt.Sprintf("  url: %s\n  ca: pki/ca.crt\n  report_interval: 1h\n  order_interval: 100ms\n  backoff: {initial: 50ms, max: 200ms}\n", relay.URL)
	a.start()
	// The holdings job's first pass, at start, is over: from here on only
	// the interval, an hour away, or a store's signal runs another. (It
	// had nothing to report, so it is no last success.)
	eventually(t, "a's first holdings pass", func() bool {
		st, err := a.client.Status(context.Background())
		return err == nil && st.RelayAPI != nil && st.RelayAPI.Holdings.Passes > 0 && st.RelayAPI.Holdings.Failures == 0
	})
	var td struct {
		ID      string   `json:"id"`
		Holders []string `json:"holders"`
	}
	if err := json.Unmarshal(call("POST", "/v1/takedowns", []byte(`{"content_id":"seg-1","reason":"dmca 2026-119"}`)), &td); err != nil || len(td.Holders) != 0 {
		t.Fatalf("takedown %+v: %v", td, err)
	}
	// status is the zero status while the takedown's record is on its way
	// to its partition (503 takedown_pending).
	status := func() takedownStatus {
		t.Helper()
		var s takedownStatus
		if b := call("GET", "/v1/takedowns/"+td.ID, nil); b != nil {
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
		}
		if s.Complete && s.ReceiptsVerified != s.HoldersExpected {
			t.Fatalf("takedown reported complete early: %+v", s)
		}
		return s
	}
	eventually(t, "a takedown of a content no node reported: complete, 0 of 0", func() bool {
		s := status()
		return s.ID == td.ID && s.Complete && s.HoldersExpected == 0
	})

	seg := bytes.Repeat([]byte("late holder "), 500)
	putFile(t, a, "seg-1", seg)
	eventually(t, "a, a late holder reported on its store, evicted with a verified receipt", func() bool {
		s := status()
		return s.Complete && s.HoldersExpected == 1 && s.holder("a") == "evicted"
	})
	if a.has("seg-1", digest(seg)) {
		t.Fatal("a still holds seg-1")
	}
	st, err := a.client.Status(context.Background())
	if err != nil || st.RelayAPI == nil || st.RelayAPI.Holdings.Counts["sent"] < 1 {
		t.Fatalf("a's relay API status %+v: %v", st.RelayAPI, err)
	}
}
