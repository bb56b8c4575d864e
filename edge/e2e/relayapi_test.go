package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
	"github.com/relay-dev/relay/edge/takedown"
)

// relayAPIConfig is a node's relay_api section towards srv, with short
// intervals: the tests wait on what the server sees, the intervals only
// bound how soon.
func relayAPIConfig(srv *relayapitest.Server) string {
	return fmt.Sprintf("  url: %s\n  ca: pki/ca.crt\n  report_interval: 100ms\n  order_interval: 100ms\n  backoff: {initial: 50ms, max: 200ms}\n", srv.URL())
}

// TestRelayAPIKilledBeforeReceipt: two real edged processes work with the
// contract server over mutual TLS; each is killed (SIGKILL) between the
// eviction an order asked for and the relay's acceptance of its receipt.
// a dies while its receipt post is in flight (the relay took it, the
// answer is lost with the process); b kills itself right after the
// takedown's transaction committed (fault point kill-unindex), before its
// cursor moved or anything was posted. After a restart each posts the
// receipt, the relay holds one verified receipt per order, each node
// reports the segment evicted, and the receipt a accepted twice is
// answered replayed, not applied again.
func TestRelayAPIKilledBeforeReceipt(t *testing.T) {
	cl := newCluster(t, "a", "b")
	a, b := cl.nodes["a"], cl.nodes["b"]
	a.peers, b.peers = nil, nil // each keeps its own segment
	srv := relayapitest.New(t, relayapitest.Options{PKIDir: filepath.Join(cl.dir, "pki")})
	a.relayAPI, b.relayAPI = relayAPIConfig(srv), relayAPIConfig(srv)
	b.faults = filepath.Join(cl.dir, "b-faults")
	a.start()
	b.start()
	segA, segB := bytes.Repeat([]byte("a "), 5000), bytes.Repeat([]byte("b "), 6000)
	putFile(t, a, "seg-a", segA)
	putFile(t, b, "seg-b", segB)
	for _, n := range []*node{a, b} {
		seg := "seg-" + n.id
		eventually(t, n.id+" reports "+seg+" held", func() bool { return srv.Holdings(n.id)[seg].State == "held" })
	}

	// a: killed while its receipt post is in flight.
	var once sync.Once
	inFlight, release := make(chan struct{}), make(chan struct{})
	srv.OnRequest(func(r relayapitest.Request) {
		if r.Route == relayapitest.Receipts && r.Node == "a" {
			once.Do(func() {
				close(inFlight)
				<-release
			})
		}
	})
	orderA := srv.AddOrder("a", "seg-a", digest(segA), "td-1", "dmca 2026-118")
	<-inFlight
	a.kill()
	close(release)
	a.start()

	// b: killed right after its takedown committed.
	if err := os.WriteFile(b.faults, []byte("kill-unindex"), 0o600); err != nil {
		t.Fatal(err)
	}
	orderB := srv.AddOrder("b", "seg-b", digest(segB), "td-1", "dmca 2026-118")
	b.mu.Lock()
	done := b.waitDone
	b.mu.Unlock()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("b did not reach the fault point")
	}
	b.kill()
	for _, r := range srv.Requests(relayapitest.Receipts) {
		if r.Node == "b" {
			t.Fatal("b posted a receipt before its restart")
		}
	}
	if err := os.WriteFile(b.faults, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.start()

	pem, err := os.ReadFile(filepath.Join(cl.dir, "pki", pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	for _, c := range []struct {
		n   *node
		o   relayapitest.Order
		seg []byte
	}{{a, orderA, segA}, {b, orderB, segB}} {
		eventually(t, c.n.id+"'s receipt accepted", func() bool { _, ok := srv.Receipts()[c.o.Request]; return ok })
		eventually(t, c.n.id+" reports "+c.o.ContentID+" evicted", func() bool {
			return srv.Holdings(c.n.id)[c.o.ContentID].State == "evicted"
		})
		s, err := takedown.ParseLine([]byte(srv.Receipts()[c.o.Request]))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := takedown.Verify(s, pool, time.Now()); err != nil || s.Receipt.Node != c.n.id || s.Receipt.SHA256 != digest(c.seg) {
			t.Fatalf("%s's receipt %+v: %v", c.n.id, s.Receipt, err)
		}
		if c.n.has(c.o.ContentID, digest(c.seg)) {
			t.Fatalf("%s still holds %s", c.n.id, c.o.ContentID)
		}
	}
	eventually(t, "a's status: the receipt replayed, nothing pending", func() bool {
		st, err := a.client.Status(context.Background())
		return err == nil && st.RelayAPI != nil && st.RelayAPI.Receipts.Counts["replayed"] == 1 && st.RelayAPI.Receipts.Pending == 0 &&
			st.RelayAPI.Cursor == orderA.Cursor
	})
	if out := edgectl(t, a.rpc, "status"); !regexp.MustCompile(`(?m)^relay api\s+`+regexp.QuoteMeta(srv.URL())+` \(mtls\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^\s+receipts\s+accepted 0, replayed 1, refused 0, 0 pending`).MatchString(out) {
		t.Errorf("edgectl status of a:\n%s", out)
	}
	st, err := b.client.Status(context.Background())
	if err != nil || st.RelayAPI == nil || st.RelayAPI.Orders.Counts["receipt"] != 1 {
		t.Fatalf("b's status %+v %v: want the order applied again after the restart, answered from the stored receipt", st.RelayAPI, err)
	}
}
