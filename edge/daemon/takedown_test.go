package daemon

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/edge/wire"
)

func caPool(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(b)
	return p
}

func recordOf(t *testing.T, n *testNode, seg, peer string) (rpc.Record, bool) {
	t.Helper()
	rs, err := n.client.Records(context.Background(), "all")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs.Records {
		if r.Segment == seg && r.Peer == peer {
			return r, true
		}
	}
	return rpc.Record{}, false
}

// TestTakedownRefusesOffers: b takes a segment down; the receipt it
// returns verifies against the CA alone, and asking again returns the same
// bytes; a segment b never held gets no receipt. a, which holds the
// segment and owes it to b, is refused with NACK evicted and cancels its
// record: one attempt, never retried, not deadlettered, while it goes on
// delivering other segments to b. A raw sender on each older wire version
// is refused with bad_request, and an ingest with 409.
func TestTakedownRefusesOffers(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	aRelay, aRPC, bRelay, bRPC := listen(t), listen(t), listen(t), listen(t)
	bCfg := nodeConfig(t, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(), nil)
	bCfg.AcceptFrom = []string{"a"} // b owes nothing to anyone
	b := startNode(t, bCfg, bRelay, bRPC)
	ctx := context.Background()
	seg := bytes.Repeat([]byte("taken down"), 100)
	put(t, b, "seg-1", seg)

	rep, err := b.client.Takedown(ctx, rpc.TakedownRequest{Segment: "seg-1", Request: "req-1"})
	if err != nil || !rep.Evicted || rep.SHA256 != digest(seg) {
		t.Fatalf("takedown: %+v %v", rep, err)
	}
	if stored(b, "seg-1") {
		t.Fatal("seg-1 still stored")
	}
	s, err := takedown.ParseLine([]byte(rep.Receipt))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := takedown.Verify(s, caPool(t, dir), time.Now()); err != nil || s.Receipt.Node != "b" || s.Receipt.ContentID != "seg-1" || s.Receipt.Request != "req-1" {
		t.Fatalf("receipt %+v: %v", s.Receipt, err)
	}
	again, err := b.client.Takedown(ctx, rpc.TakedownRequest{Segment: "seg-1", Request: "req-1"})
	if err != nil || again.Evicted || again.Receipt != rep.Receipt {
		t.Fatalf("again: %+v %v", again, err)
	}
	var he *rpc.Error
	if _, err := b.client.Takedown(ctx, rpc.TakedownRequest{Segment: "never", Request: "req-1"}); !errors.As(err, &he) || he.Status != http.StatusNotFound {
		t.Fatalf("never held: %v", err)
	}
	if _, err := b.client.Takedown(ctx, rpc.TakedownRequest{Segment: "seg-1", Request: "bad request id"}); !errors.As(err, &he) || he.Status != http.StatusBadRequest {
		t.Fatalf("bad request id: %v", err)
	}
	if _, err := b.client.PutSegment(ctx, "seg-1", int64(len(seg)), digest(seg), bytes.NewReader(seg)); !errors.As(err, &he) || he.Status != http.StatusConflict {
		t.Fatalf("ingest after takedown: %v", err)
	}
	rs, err := b.client.Receipts(ctx, "")
	if err != nil || len(rs.Receipts) != 1 || rs.Receipts[0].Receipt != rep.Receipt {
		t.Fatalf("receipts %+v %v", rs, err)
	}

	// Older senders are told bad_request, which they know.
	for _, v := range []int{wire.Version1, wire.Version3} {
		c := rawSenderVersion(t, dir, b, v)
		var code wire.NackCode
		if v == wire.Version1 {
			n, err := deliverV1(ctx, c, offer("seg-1", seg), seg)
			if err != nil || n == nil {
				t.Fatalf("v%d: %+v %v", v, n, err)
			}
			code = n.Code
		} else {
			code = offerPipelined(t, ctx, c, offer("seg-1", seg))
		}
		if code != wire.NackBadRequest {
			t.Fatalf("version %d sender told %s, want bad_request", v, code)
		}
	}
	if code := offerPipelined(t, ctx, rawSenderVersion(t, dir, b, wire.Version4), offer("seg-1", seg)); code != wire.NackEvicted {
		t.Fatalf("version 4 sender told %s, want evicted", code)
	}

	// A real sender: a holds seg-1 and owes it to b.
	aCfg := nodeConfig(t, dir, "a", aRelay.Addr().String(), aRPC.Addr().String(), []config.Peer{{ID: "b", Address: bRelay.Addr().String()}})
	a := startNode(t, aCfg, aRelay, aRPC)
	put(t, a, "seg-1", seg)
	waitUntil(t, "a's record for b cancelled", func() bool {
		r, ok := recordOf(t, a, "seg-1", "b")
		return ok && r.State == ledger.StateCancelled.String()
	})
	// a goes on delivering to b; seg-1's record stays as it was.
	put(t, a, "seg-2", []byte("another"))
	waitUntil(t, "seg-2 at b", func() bool { return stored(b, "seg-2") })
	r, _ := recordOf(t, a, "seg-1", "b")
	if r.State != "cancelled" || r.Attempts != 1 || !strings.Contains(r.LastError, "evicted") {
		t.Fatalf("a's record after more traffic: %+v", r)
	}
	if dl, _ := a.client.Records(ctx, "deadletter"); len(dl.Records) != 0 {
		t.Fatalf("deadlettered: %+v", dl.Records)
	}
	if m, _ := b.client.Metrics(ctx); !strings.Contains(m, `edged_nacks_sent_total{code="evicted"} 2`) || !strings.Contains(m, `edged_takedowns_total{result="evicted"} 1`) {
		t.Errorf("metrics lack the evicted nacks or the takedown:\n%s", grepLines(m, "evicted"))
	}
	if m, _ := a.client.Metrics(ctx); !strings.Contains(m, `edged_relay_attempts_total{outcome="cancelled",peer="b"} 1`) {
		t.Errorf("a's metrics lack the cancelled attempt:\n%s", grepLines(m, "attempts_total"))
	}
}

// deliverV1 runs one version 1 exchange and returns the NACK, if any.
func deliverV1(ctx context.Context, c *wire.Conn, o wire.Offer, content []byte) (*wire.Nack, error) {
	if err := c.SendOffer(ctx, o); err != nil {
		return nil, err
	}
	if err := c.SendSegment(ctx, o, bytes.NewReader(content)); err != nil {
		return nil, err
	}
	return c.RecvAckOrNack(ctx, o.SegmentID)
}

// offerPipelined offers o on a version 2+ connection and returns the
// peer's NACK code ("" if it was accepted or acknowledged).
func offerPipelined(t *testing.T, ctx context.Context, c *wire.Conn, o wire.Offer) wire.NackCode {
	t.Helper()
	res := c.DeliverWindow(ctx, []wire.Item{{Offer: o, Open: func() (io.ReadCloser, error) {
		return nil, errors.New("not sent: the offer should be refused")
	}}}, 10*time.Second)
	var ne *wire.NackError
	if !errors.As(res[0].Err, &ne) {
		t.Fatalf("offer %s: %v, want a NACK", o.SegmentID, res[0].Err)
	}
	return ne.Nack.Code
}

// TestTakedownWhileInFlight: b's attempt to send seg-1 to a is in flight
// (its dial held at a gate) when b takes seg-1 down. The attempt then
// finds its record cancelled and records nothing: the record stays
// cancelled, not failed or deadlettered, and a never stores seg-1.
func TestTakedownWhileInFlight(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	aRelay, aRPC, bRelay, bRPC := listen(t), listen(t), listen(t), listen(t)
	aCfg := nodeConfig(t, dir, "a", aRelay.Addr().String(), aRPC.Addr().String(), nil)
	aCfg.AcceptFrom = []string{"b"}
	a := startNode(t, aCfg, aRelay, aRPC)
	g := newHoldGate(t, aRelay.Addr().String())
	bCfg := nodeConfig(t, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(), []config.Peer{{ID: "a", Address: g.ln.Addr().String()}})
	b := startNode(t, bCfg, bRelay, bRPC)
	ctx := context.Background()
	put(t, b, "seg-1", bytes.Repeat([]byte("in flight "), 1000))
	<-g.accepted
	waitUntil(t, "b's attempt in flight", func() bool {
		r, ok := recordOf(t, b, "seg-1", "a")
		return ok && r.State == ledger.StateInflight.String()
	})
	rep, err := b.client.Takedown(ctx, rpc.TakedownRequest{Segment: "seg-1", Request: "req-1"})
	if err != nil || !rep.Evicted || rep.Cancelled != 1 {
		t.Fatalf("takedown: %+v %v", rep, err)
	}
	close(g.release)
	waitUntil(t, "b's attempt ended", func() bool {
		m, _ := b.client.Metrics(ctx)
		return strings.Contains(m, `edged_relay_attempts_total{outcome="cancelled",peer="a"} 1`)
	})
	r, _ := recordOf(t, b, "seg-1", "a")
	if r.State != ledger.StateCancelled.String() || !strings.Contains(r.LastError, "takedown request req-1") {
		t.Fatalf("b's record: %+v", r)
	}
	if stored(a, "seg-1") {
		t.Fatal("a stored seg-1 after the takedown")
	}
}

// holdGate accepts connections to target and holds them, forwarding
// nothing, until release is closed; accepted is closed at the first.
type holdGate struct {
	ln                net.Listener
	accepted, release chan struct{}
}

func newHoldGate(t *testing.T, target string) *holdGate {
	g := &holdGate{ln: listen(t), accepted: make(chan struct{}), release: make(chan struct{})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		first := true
		for {
			c, err := g.ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if first {
				close(g.accepted)
				first = false
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-g.release
				up, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				mu.Lock()
				conns = append(conns, up)
				mu.Unlock()
				wg.Add(1)
				go func() { defer wg.Done(); io.Copy(up, c); up.Close(); c.Close() }()
				io.Copy(c, up)
				c.Close()
				up.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		g.ln.Close()
		select {
		case <-g.release:
		default:
			close(g.release)
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return g
}
