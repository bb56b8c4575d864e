package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 30 * time.Second

// testNode is one in-process daemon on 127.0.0.1 with real certificates,
// a real bbolt file and real sockets.
type testNode struct {
	id     string
	cfg    *config.Config
	d      *Daemon
	client *rpc.Client
	stop   func()
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startCluster starts one daemon per id, each knowing all the others.
func startCluster(t testing.TB, pkiDir string, ids []string, mod func(*config.Config)) map[string]*testNode {
	t.Helper()
	relayLns, rpcLns := map[string]net.Listener{}, map[string]net.Listener{}
	for _, id := range ids {
		relayLns[id], rpcLns[id] = listen(t), listen(t)
	}
	nodes := map[string]*testNode{}
	for _, id := range ids {
		var peers []config.Peer
		for _, p := range ids {
			if p != id {
				peers = append(peers, config.Peer{ID: p, Address: relayLns[p].Addr().String()})
			}
		}
		cfg := nodeConfig(t, pkiDir, id, relayLns[id].Addr().String(), rpcLns[id].Addr().String(), peers)
		if mod != nil {
			mod(cfg)
		}
		nodes[id] = startNode(t, cfg, relayLns[id], rpcLns[id])
	}
	return nodes
}

// nodeConfig is a test configuration: fast back-off, a fresh storage dir.
func nodeConfig(t testing.TB, pkiDir, id, listen, rpcListen string, peers []config.Peer) *config.Config {
	cfg := config.Default()
	cfg.NodeID = id
	cfg.Listen = listen
	cfg.RPC.Listen = rpcListen
	cfg.TLS = config.TLS{
		Cert: filepath.Join(pkiDir, id+".crt"), Key: filepath.Join(pkiDir, id+".key"),
		CA: filepath.Join(pkiDir, pki.CACertFile),
	}
	cfg.Storage.Dir = t.TempDir()
	cfg.Relay.Backoff = config.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	cfg.Relay.AckTimeout = 10 * time.Second
	cfg.KnownPeers = peers
	return cfg
}

func startNode(t testing.TB, cfg *config.Config, relayLn, rpcLn net.Listener, mods ...func(*Options)) *testNode {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	opt := Options{Log: log, Version: "test"}
	for _, m := range mods {
		m(&opt)
	}
	d, err := New(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	d.ListenOn(relayLn, rpcLn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	n := &testNode{id: cfg.NodeID, cfg: cfg, d: d, client: rpc.NewClient(rpcLn.Addr().String())}
	stopped := false
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: serve: %v", cfg.NodeID, err)
		}
		n.client.Close()
	}
	t.Cleanup(n.stop)
	waitUntil(t, cfg.NodeID+" healthy", func() bool { return n.client.Healthz(context.Background()) == nil })
	return n
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func put(t testing.TB, n *testNode, id string, content []byte) {
	t.Helper()
	if _, err := n.client.PutSegment(context.Background(), id, int64(len(content)), digest(content), bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
}

func stored(n *testNode, id string) bool {
	ix, err := n.client.Index(context.Background())
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ix.Segments, func(s rpc.Segment) bool { return s.ID == id })
}

func assured(n *testNode, id string) bool {
	a, err := n.client.Assurance(context.Background(), id)
	return err == nil && a.Met && a.Relayed
}

// TestThreeNodesConverge: a segment ingested on a reaches b and c, is
// relayed at a under all_peers, and neither b nor c sends it back to the
// peer it received it from.
//
// Which peer that is, is a race the protocol allows: a sends to b and c at
// once, and b (having stored it) relays to c, so c may store b's copy
// before a's arrives (a's then finds it held and is re-acknowledged). So
// the source is read from each node's index, not assumed to be a. The
// "c from ..." cases force each order by holding one link to c shut until
// c has the segment; "free" leaves it to the scheduler.
func TestThreeNodesConverge(t *testing.T) {
	for _, tc := range []struct {
		name    string
		held    string // whose link to c stays shut until c stores seg-1
		cSource string // the source c must record ("" for either)
	}{
		{name: "free"},
		{name: "c from a", held: "b", cSource: "a"},
		{name: "c from b", held: "a", cSource: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := pkitest.New(t, "a", "b", "c")
			var g *gate
			nodes := startCluster(t, dir, []string{"a", "b", "c"}, func(cfg *config.Config) {
				if cfg.NodeID != tc.held {
					return
				}
				for i, p := range cfg.KnownPeers {
					if p.ID == "c" {
						g = newGate(t, p.Address)
						cfg.KnownPeers[i].Address = g.addr()
					}
				}
			})
			put(t, nodes["a"], "seg-1", bytes.Repeat([]byte("edge "), 1000))
			if g != nil {
				waitUntil(t, "c stores seg-1", func() bool { return stored(nodes["c"], "seg-1") })
				g.open()
			}
			checkConverged(t, nodes, "seg-1", tc.cSource)
		})
	}
}

// checkConverged waits until a, b and c hold seg and each has relayed it,
// then checks each one's required peers: the other two nodes minus the
// one it received seg from.
func checkConverged(t *testing.T, nodes map[string]*testNode, seg, cSource string) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, "a relayed "+seg, func() bool { return assured(nodes["a"], seg) })
	fromA := 0
	for _, id := range []string{"b", "c"} {
		n := nodes[id]
		waitUntil(t, id+" stores "+seg, func() bool { return stored(n, seg) })
		src := source(t, n, seg)
		if src == "a" {
			fromA++
		}
		if id == "c" && cSource != "" && src != cSource {
			t.Errorf("c received %s from %s, want %s", seg, src, cSource)
		}
		want := slices.DeleteFunc([]string{"a", "b", "c"}, func(p string) bool { return p == id || p == src })
		waitUntil(t, id+" relayed "+seg, func() bool { return assured(n, seg) })
		a, err := n.client.Assurance(ctx, seg)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.RequiredPeers, want) {
			t.Errorf("%s: required peers %v, want %v (source %s)", id, a.RequiredPeers, want, src)
		}
		for _, r := range a.Records {
			if r.Peer == src {
				t.Errorf("%s scheduled %s back to its source: %+v", id, seg, r)
			}
		}
	}
	// The first of b and c to store it can only have had it from a.
	if fromA == 0 {
		t.Errorf("neither b nor c records a as the source of %s", seg)
	}
	st, err := nodes["a"].client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ledger["acked"] != 2 || st.Segments != 1 || st.Relayed != 1 {
		t.Errorf("a status %+v", st)
	}
	// Counters are bumped by the relay's observer after the ledger and the
	// index commit, so a reader can see "relayed" a moment before them
	// (a stress run on a loaded machine did): wait for them.
	wantMetrics := []string{`edged_ledger_records{state="acked"} 2`, `edged_relay_attempts_total{outcome="acked",peer="b"} 1`, "edged_relay_success_total 1"}
	waitUntil(t, fmt.Sprintf("a's metrics show %q", wantMetrics), func() bool {
		m, err := nodes["a"].client.Metrics(ctx)
		return err == nil && !slices.ContainsFunc(wantMetrics, func(w string) bool { return !strings.Contains(m, w) })
	})
}

// source is the peer a node recorded as the source of a stored segment.
func source(t *testing.T, n *testNode, seg string) string {
	t.Helper()
	idx, err := n.client.Index(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range idx.Segments {
		if s.ID == seg {
			return s.Source
		}
	}
	t.Fatalf("%s does not store %s", n.id, seg)
	return ""
}

// gate stands between a node and a peer's relay address. Until open it
// closes every connection at once (the dial fails, as if the peer were
// down); after, it forwards bytes both ways. It orders deliveries in
// tests without reaching into the daemon.
type gate struct {
	ln     net.Listener
	target string
	opened chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newGate(t *testing.T, target string) *gate {
	g := &gate{ln: listen(t), target: target, opened: make(chan struct{})}
	g.wg.Add(1)
	go g.loop()
	t.Cleanup(func() {
		g.ln.Close()
		g.mu.Lock()
		for _, c := range g.conns {
			c.Close()
		}
		g.mu.Unlock()
		g.wg.Wait()
	})
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }
func (g *gate) open()        { close(g.opened) }

func (g *gate) loop() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		select {
		case <-g.opened:
		default:
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", g.target)
		if err != nil {
			c.Close()
			continue
		}
		g.mu.Lock()
		g.conns = append(g.conns, c, up)
		g.mu.Unlock()
		for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				io.Copy(pair[0], pair[1])
				pair[0].Close()
				pair[1].Close()
			}()
		}
	}
}

// rawSender dials a node with node a's certificate and speaks the wire
// protocol directly, to send what edged itself never would. It speaks
// version 1 (stop-and-wait), as agents before version 2 do; rawSenderV2
// negotiates version 2.
func rawSender(t *testing.T, pkiDir string, to *testNode) *wire.Conn {
	return rawSenderVersion(t, pkiDir, to, wire.Version1)
}

func rawSenderVersion(t *testing.T, pkiDir string, to *testNode, version int) *wire.Conn {
	t.Helper()
	tr, err := transport.New(transport.Config{
		NodeID: "a", CertFile: filepath.Join(pkiDir, "a.crt"), KeyFile: filepath.Join(pkiDir, "a.key"),
		CAFile: filepath.Join(pkiDir, pki.CACertFile), AllowPeer: func(string) bool { return true },
		Wire: wire.Options{Version: version},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.Dial(context.Background(), to.cfg.Listen, to.id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func offer(id string, content []byte) wire.Offer {
	return wire.Offer{SegmentID: id, Size: int64(len(content)), SHA256: digest(content)}
}

// TestReceiveRefusals drives one receiver through every refusal on a
// single connection: each NACK carries its code, nothing is stored, and
// the connection keeps serving; then a good segment is ACKed.
func TestReceiveRefusals(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	nodes := startCluster(t, dir, []string{"a", "b"}, func(c *config.Config) {
		if c.NodeID == "b" {
			c.Storage.QuotaBytes = 1000
			c.Storage.MaxSegmentBytes = 600
			c.Storage.QuotaSegments = 2
		}
	})
	b := nodes["b"]
	c := rawSender(t, dir, b)
	ctx := context.Background()
	send := func(o wire.Offer, content []byte) (*wire.Nack, error) {
		t.Helper()
		if err := c.SendOffer(ctx, o); err != nil {
			t.Fatal(err)
		}
		if err := c.SendSegment(ctx, o, bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
		return c.RecvAckOrNack(ctx, o.SegmentID)
	}
	good := bytes.Repeat([]byte("g"), 500)
	cases := []struct {
		name    string
		o       wire.Offer
		content []byte
		want    wire.NackCode
	}{
		{"bad digest", wire.Offer{SegmentID: "bad-digest", Size: 500, SHA256: digest([]byte("other"))}, good, wire.NackChecksum},
		{"too large", offer("too-large", make([]byte, 601)), make([]byte, 601), wire.NackTooLarge},
	}
	for _, tc := range cases[:1] {
		n, err := send(tc.o, tc.content)
		if err != nil || n == nil || n.Code != tc.want {
			t.Fatalf("%s: nack %+v, err %v; want %s", tc.name, n, err, tc.want)
		}
	}
	// A good segment on the same connection: ACK, and again (idempotent).
	for range 2 {
		if n, err := send(offer("good", good), good); err != nil || n != nil {
			t.Fatalf("good segment: nack %+v, err %v", n, err)
		}
	}
	// 500 stored + 501 > 1000 bytes: quota.
	big := bytes.Repeat([]byte("q"), 501)
	if n, err := send(offer("over-quota", big), big); err != nil || n == nil || n.Code != wire.NackQuota {
		t.Fatalf("over quota: nack %+v, err %v", n, err)
	}
	// Too large: refused and the connection closed (not worth reading).
	n, err := send(cases[1].o, cases[1].content)
	if err != nil || n == nil || n.Code != wire.NackTooLarge {
		t.Fatalf("too large: nack %+v, err %v", n, err)
	}
	ix, err := b.client.Index(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ix.Segments) != 1 || ix.Segments[0].ID != "good" || ix.Segments[0].Source != "a" {
		t.Fatalf("index after refusals: %+v", ix.Segments)
	}
	if q, _ := b.client.Quota(ctx); q.Bytes != 500 || q.ReservedBytes != 0 || q.ReservedSegments != 0 {
		t.Fatalf("quota after refusals: %+v (a refused receive left a reservation?)", q)
	}
	m, _ := b.client.Metrics(ctx)
	for _, code := range []string{"checksum", "quota", "too_large"} {
		if !strings.Contains(m, fmt.Sprintf(`edged_nacks_sent_total{code=%q} 1`, code)) {
			t.Errorf("metrics lack one %s nack", code)
		}
	}
}

// TestReceiveV1LargeSegmentDigest: a version 1 receiver hashes each
// SEGMENT once, in the segment store while it writes (not also in the
// wire), so the store's check is the only one: a 1 MiB segment (hashed on
// the store's hashing goroutine) with one byte changed is NACKed checksum
// and not stored, and the connection then carries the right one, which is
// stored byte for byte.
func TestReceiveV1LargeSegmentDigest(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	b := startCluster(t, dir, []string{"a", "b"}, nil)["b"]
	c := rawSender(t, dir, b)
	ctx := context.Background()
	good := make([]byte, 1<<20)
	for i := range good {
		good[i] = byte(i * 31)
	}
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)-1000] ^= 1
	o := offer("big", good)
	for i, content := range [][]byte{corrupt, good} {
		if err := c.SendOffer(ctx, o); err != nil {
			t.Fatal(err)
		}
		if err := c.SendSegment(ctx, o, bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
		n, err := c.RecvAckOrNack(ctx, o.SegmentID)
		switch {
		case err != nil:
			t.Fatalf("exchange %d: %v", i, err)
		case i == 0 && (n == nil || n.Code != wire.NackChecksum):
			t.Fatalf("corrupt segment: nack %+v, want checksum", n)
		case i == 1 && n != nil:
			t.Fatalf("good segment: nack %+v", n)
		}
		if i == 0 {
			if _, err := b.d.store.Stat(o.SegmentID); !errors.Is(err, segstore.ErrNotFound) {
				t.Fatalf("after the checksum NACK: Stat = %v, want ErrNotFound", err)
			}
		}
	}
	f, _, err := b.d.store.Open(o.SegmentID)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stored, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(stored, good) {
		t.Fatalf("stored %d bytes (err %v), differing from the %d sent", len(stored), err, len(good))
	}
}

// TestBadOfferClosesConnection: an undecodable OFFER is answered with
// NACK bad_request, and the daemon keeps serving other connections.
func TestBadOfferClosesConnection(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	nodes := startCluster(t, dir, []string{"a", "b"}, nil)
	c := rawSender(t, dir, nodes["b"])
	ctx := context.Background()
	nc := c.NetConn()
	if err := wire.WriteFrame(nc, wire.TypeOffer, []byte(`{"segment_id":"../etc/passwd","size":1,"sha256":"00"}`)); err != nil {
		t.Fatal(err)
	}
	n, err := c.RecvAckOrNack(ctx, "")
	if err != nil || n == nil || n.Code != wire.NackBadRequest {
		t.Fatalf("bad offer: nack %+v, err %v", n, err)
	}
	if _, err := c.RecvOffer(ctx); err == nil {
		t.Fatal("connection still open after a bad offer")
	}
	content := []byte("after")
	c2 := rawSender(t, dir, nodes["b"])
	if err := c2.Deliver(ctx, offer("after", content), bytes.NewReader(content)); err != nil {
		t.Fatalf("daemon stopped serving after a bad offer: %v", err)
	}
}

// TestIngestErrors: RPC ingest maps store errors to HTTP statuses.
func TestIngestErrors(t *testing.T) {
	dir := pkitest.New(t, "a")
	n := startCluster(t, dir, []string{"a"}, func(c *config.Config) { c.Storage.MaxSegmentBytes = 10 })["a"]
	ctx := context.Background()
	_, err := n.client.PutSegment(ctx, "x", 3, digest([]byte("abd")), strings.NewReader("abc"))
	var re *rpc.Error
	if !errors.As(err, &re) || re.Status != 400 {
		t.Fatalf("wrong digest: %v", err)
	}
	_, err = n.client.PutSegment(ctx, "y", 11, digest(make([]byte, 11)), bytes.NewReader(make([]byte, 11)))
	if !errors.As(err, &re) || re.Status != 413 {
		t.Fatalf("too large: %v", err)
	}
	if ix, _ := n.client.Index(ctx); len(ix.Segments) != 0 {
		t.Fatalf("refused ingests stored %+v", ix.Segments)
	}
	if _, err := n.client.PutPath(ctx, "relative/path", ""); !errors.As(err, &re) || re.Status != 400 {
		t.Fatalf("relative path: %v", err)
	}
	_, err = n.client.RetryDeadletter(ctx, rpc.Selector{Segment: "nope", Peer: "b"})
	if !errors.As(err, &re) || re.Status != 404 {
		t.Fatalf("retry of an absent record: %v", err)
	}
}

// TestAssuranceAfterEviction: a forwarder (b, evict_on_relay, all_peers)
// in the chain a–b–c receives a segment from a, relays it to c, and
// evicts it. Its assurance must still say the condition was met over the
// segment's required peers ({c}); judging an evicted segment over every
// known peer counted the source a, which is never owed the segment, and
// reported "not met" for every segment a forwarder ever evicted.
func TestAssuranceAfterEviction(t *testing.T) {
	dir := pkitest.New(t, "a", "b", "c")
	nodes := startCluster(t, dir, []string{"a", "b", "c"}, func(c *config.Config) {
		if c.NodeID == "a" || c.NodeID == "c" {
			c.KnownPeers = slices.DeleteFunc(c.KnownPeers, func(p config.Peer) bool { return p.ID != "b" })
		}
		if c.NodeID == "b" {
			c.Relay.EvictOnRelay = true
		}
	})
	b, c := nodes["b"], nodes["c"]
	put(t, nodes["a"], "fwd-1", []byte("forwarded once"))
	waitUntil(t, "c stores fwd-1", func() bool { return stored(c, "fwd-1") })
	waitUntil(t, "b evicts fwd-1", func() bool {
		ix, err := b.client.Index(context.Background())
		return err == nil && len(ix.Segments) == 0 && testMetric(b, "edged_evicted_segments_total 1")
	})
	a, err := b.client.Assurance(context.Background(), "fwd-1")
	if err != nil {
		t.Fatal(err)
	}
	if a.Stored || !a.Met || !slices.Equal(a.RequiredPeers, []string{"c"}) || !slices.Equal(a.AckedPeers, []string{"c"}) {
		t.Fatalf("assurance of an evicted, fully relayed segment: %+v; want met over required [c]", a)
	}
}

func testMetric(n *testNode, line string) bool {
	m, err := n.client.Metrics(context.Background())
	return err == nil && strings.Contains(m, line)
}

// TestInboundConnectionsPerPeerBounded: every inbound connection costs a
// goroutine, TLS buffers and, while receiving, copy buffers and a file.
// A configured peer (compromised, or buggy) must not be able to open them
// without bound; edged itself never holds more than relay.workers
// connections to one peer. Connections over the limit are closed at once
// and counted as rejected; a freed slot is usable again.
func TestInboundConnectionsPerPeerBounded(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "b", relayLn.Addr().String(), rpcLn.Addr().String(), []config.Peer{{ID: "a", Address: "127.0.0.1:1"}})
	b := startNode(t, cfg, relayLn, rpcLn, func(o *Options) { o.MaxConnsPerPeer = 2 })
	ctx := context.Background()
	deliver := func(c *wire.Conn, id string) error {
		content := []byte(id)
		return c.Deliver(ctx, offer(id, content), bytes.NewReader(content))
	}
	c1, c2 := rawSender(t, dir, b), rawSender(t, dir, b)
	if err := deliver(c1, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := deliver(c2, "s2"); err != nil {
		t.Fatal(err)
	}
	c3 := rawSender(t, dir, b)
	if err := deliver(c3, "s3"); err == nil {
		t.Fatal("a third concurrent connection from one peer was served")
	}
	waitUntil(t, "rejection counted", func() bool { return testMetric(b, "edged_inbound_connections_rejected_total 1") })
	c1.Close()
	waitUntil(t, "slot freed", func() bool {
		c := rawSender(t, dir, b)
		defer c.Close()
		return deliver(c, "s4") == nil
	})
	if err := deliver(c2, "s5"); err != nil {
		t.Fatalf("connection within the limit stopped serving: %v", err)
	}
}
