package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rejects collects a listener's OnReject reports.
type rejects struct {
	ch chan error
}

func newRejects() *rejects { return &rejects{ch: make(chan error, 16)} }

func (r *rejects) add(_ net.Addr, err error) { r.ch <- err }

func allow(ids ...string) func(string) bool {
	return func(id string) bool { return slices.Contains(ids, id) }
}

func newTransport(t testing.TB, dir, id string, peers []string, mod func(*Config)) *Transport {
	t.Helper()
	cfg := Config{
		NodeID:    id,
		CertFile:  filepath.Join(dir, id+".crt"),
		KeyFile:   filepath.Join(dir, id+".key"),
		CAFile:    filepath.Join(dir, pki.CACertFile),
		AllowPeer: allow(peers...),
	}
	if mod != nil {
		mod(&cfg)
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func listen(t testing.TB, tr *Transport) *Listener {
	t.Helper()
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type acceptResult struct {
	conn *wire.Conn
	peer string
	err  error
}

func acceptAsync(l *Listener) <-chan acceptResult {
	ch := make(chan acceptResult, 1)
	go func() {
		c, p, err := l.Accept()
		ch <- acceptResult{c, p, err}
	}()
	return ch
}

func TestDialAcceptAndDeliver(t *testing.T) {
	ctx := context.Background()
	dir := pkitest.New(t, "a", "b")
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, nil))
	cli := newTransport(t, dir, "b", []string{"a"}, nil)

	accepted := acceptAsync(srv)
	c, err := cli.Dial(ctx, srv.Addr().String(), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := <-accepted
	if res.err != nil || res.peer != "b" {
		t.Fatalf("Accept = %q, %v; want peer b", res.peer, res.err)
	}
	defer res.conn.Close()
	for _, wc := range []*wire.Conn{c, res.conn} {
		cs := wc.NetConn().(*tls.Conn).ConnectionState()
		if cs.Version != tls.VersionTLS13 || len(cs.PeerCertificates) == 0 {
			t.Fatalf("TLS version %x, %d peer certs", cs.Version, len(cs.PeerCertificates))
		}
	}

	data := []byte("segment over mTLS")
	sum := sha256.Sum256(data)
	o := wire.Offer{SegmentID: "s1", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	got := make(chan []byte, 1)
	go func() {
		o, err := res.conn.RecvOffer(ctx)
		var b bytes.Buffer
		if err == nil {
			err = res.conn.RecvSegment(ctx, o, &b)
		}
		if err == nil {
			err = res.conn.SendAck(ctx, o.SegmentID)
		}
		if err != nil {
			t.Error(err)
		}
		got <- b.Bytes()
	}()
	if err := c.Deliver(ctx, o, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatalf("received %q", b)
	}
}

// TestRefusedClients: every way a client can be wrong, over real sockets.
// The client's Dial fails, the listener reports why, and Accept never
// returns the connection (the next good client is the one it returns).
func TestRefusedClients(t *testing.T) {
	ctx := context.Background()
	dir := pkitest.New(t, "a", "b", "c")
	otherCA := pkitest.New(t, "b")
	rj := newRejects()
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, func(c *Config) {
		c.OnReject = rj.add
		c.HandshakeTimeout = 2 * time.Second
	}))
	addr := srv.Addr().String()
	bCert, err := tls.LoadX509KeyPair(filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key"))
	if err != nil {
		t.Fatal(err)
	}

	// rawDial speaks TLS with a hand-made config and then tries the
	// HELLO exchange, as a misbehaving client would.
	rawDial := func(cfg *tls.Config, helloID string) error {
		cfg.InsecureSkipVerify = true // these tests are about the server's checks
		nc, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return err
		}
		wc := wire.NewConn(nc, wire.Options{})
		defer wc.Close()
		if err := wc.SendHello(ctx, helloID); err != nil {
			return err
		}
		if _, err := wc.RecvHello(ctx); err != nil {
			return err
		}
		// The server may have accepted TLS but refuses after HELLO: then
		// it closes and the next read ends.
		_, err = wc.RecvOffer(ctx)
		if errors.Is(err, io.EOF) {
			return err
		}
		return nil
	}

	// Trusts both CAs (so it can be built and would accept the server),
	// but the server trusts only its own.
	foreignB := newTransport(t, otherCA, "b", []string{"a"}, func(c *Config) {
		c.CAFile = bundle(t, filepath.Join(otherCA, pki.CACertFile), filepath.Join(dir, pki.CACertFile))
	})
	nodeC := newTransport(t, dir, "c", []string{"a"}, nil)
	for _, tc := range []struct {
		name   string
		dial   func() error
		reason string // substring of the server-side reject reason
		is     error
	}{
		{"certificate from another CA", func() error {
			_, err := foreignB.Dial(ctx, addr, "a")
			return err
		}, "certificate", nil},
		{"no client certificate", func() error {
			return rawDial(&tls.Config{MinVersion: tls.VersionTLS13}, "b")
		}, "certificate", nil},
		{"unknown node id", func() error {
			_, err := nodeC.Dial(ctx, addr, "a")
			return err
		}, "", ErrPeerNotAllowed},
		{"HELLO names another node", func() error {
			return rawDial(&tls.Config{Certificates: []tls.Certificate{bCert}}, "c")
		}, "", ErrIdentityMismatch},
		{"TLS 1.2 only", func() error {
			return rawDial(&tls.Config{Certificates: []tls.Certificate{bCert}, MaxVersion: tls.VersionTLS12}, "b")
		}, "version", nil},
		{"plain TCP garbage", func() error {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer nc.Close()
			nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
			_, err = io.ReadAll(nc)
			return errors.Join(err, errors.New("server closed"))
		}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.dial(); err == nil {
				t.Fatal("refused client connected")
			} else {
				t.Logf("client saw: %v", err)
			}
			reason := <-rj.ch
			t.Logf("server said: %v", reason)
			if tc.is != nil && !errors.Is(reason, tc.is) {
				t.Fatalf("reject reason %v, want %v", reason, tc.is)
			}
			if !strings.Contains(reason.Error(), tc.reason) {
				t.Fatalf("reject reason %v, want it to mention %q", reason, tc.reason)
			}
		})
	}

	// Nothing refused reached Accept: the first connection it returns is
	// this good one.
	accepted := acceptAsync(srv)
	c, err := newTransport(t, dir, "b", []string{"a"}, nil).Dial(ctx, addr, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res := <-accepted; res.err != nil || res.peer != "b" {
		t.Fatalf("Accept = %q, %v", res.peer, res.err)
	} else {
		res.conn.Close()
	}
}

// TestDialerRefusesWrongServer: the client checks who answered.
func TestDialerRefusesWrongServer(t *testing.T) {
	ctx := context.Background()
	dir := pkitest.New(t, "a", "b", "c")
	otherCA := pkitest.New(t, "a")
	srvA := listen(t, newTransport(t, dir, "a", []string{"b"}, nil))
	foreign := listen(t, newTransport(t, otherCA, "a", []string{"b"}, func(c *Config) {
		c.CAFile = bundle(t, filepath.Join(otherCA, pki.CACertFile), filepath.Join(dir, pki.CACertFile)) // would accept b; b must not accept it
	}))
	cli := newTransport(t, dir, "b", []string{"a", "c"}, nil)

	if _, err := cli.Dial(ctx, srvA.Addr().String(), "c"); !errors.Is(err, ErrIdentityMismatch) {
		t.Fatalf("dial c at a's address: %v, want ErrIdentityMismatch", err)
	}
	if _, err := cli.Dial(ctx, foreign.Addr().String(), "a"); err == nil || !strings.Contains(err.Error(), "verify server certificate") {
		t.Fatalf("dial a server from another CA: %v, want verification failure", err)
	}
	if _, err := cli.Dial(ctx, srvA.Addr().String(), "z"); !errors.Is(err, ErrPeerNotAllowed) {
		t.Fatalf("dial unconfigured peer: %v, want ErrPeerNotAllowed", err)
	}
}

func TestHandshakeTimeoutAndClose(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	rj := newRejects()
	tr := newTransport(t, dir, "a", []string{"b"}, func(c *Config) {
		c.OnReject = rj.add
		c.HandshakeTimeout = 50 * time.Millisecond
	})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A client that connects and says nothing is cut off by the timeout.
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if err := <-rj.ch; !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("silent client: %v, want a deadline error", err)
	}
	// Close aborts another pending handshake (the timeout is long now) and
	// unblocks Accept; goleak in TestMain checks nothing is left running.
	patient := newTransport(t, dir, "a", []string{"b"}, func(c *Config) { c.HandshakeTimeout = time.Hour })
	l2 := patient.Serve(mustListen(t))
	silent2, err := net.Dial("tcp", l2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent2.Close()
	accepted := acceptAsync(l2)
	l.Close()
	l2.Close()
	if res := <-accepted; !errors.Is(res.err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", res.err)
	}
}

// bundle concatenates PEM files into one CA file.
func bundle(t testing.TB, paths ...string) string {
	t.Helper()
	var b []byte
	for _, p := range paths {
		pem, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, pem...)
	}
	out := filepath.Join(t.TempDir(), "bundle.crt")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestNewRefusesBadConfig(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	base := Config{
		NodeID: "a", CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key"),
		CAFile: filepath.Join(dir, pki.CACertFile), AllowPeer: allow("b"),
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no AllowPeer", func(c *Config) { c.AllowPeer = nil }},
		{"bad node id", func(c *Config) { c.NodeID = "a/b" }},
		{"certificate of another node", func(c *Config) { c.CertFile, c.KeyFile = filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key") }},
		{"key of another node", func(c *Config) { c.KeyFile = filepath.Join(dir, "b.key") }},
		{"missing CA file", func(c *Config) { c.CAFile = filepath.Join(dir, "nope") }},
		{"CA that did not sign the cert", func(c *Config) { c.CAFile = filepath.Join(pkitest.New(t), pki.CACertFile) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			if _, err := New(cfg); err == nil {
				t.Fatal("New accepted it")
			} else {
				t.Log(err)
			}
		})
	}
}

// TestConcurrentPeers: several authenticated connections at once, each
// carrying its own exchange, through one Listener.
func TestConcurrentPeers(t *testing.T) {
	ctx := context.Background()
	peers := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	dir := pkitest.New(t, append([]string{"hub"}, peers...)...)
	srv := listen(t, newTransport(t, dir, "hub", peers, nil))

	var wg sync.WaitGroup
	got := make(chan string, len(peers))
	serverErr := make(chan error, len(peers))
	go func() {
		for range peers {
			c, peer, err := srv.Accept()
			if err != nil {
				serverErr <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				o, err := c.RecvOffer(ctx)
				if err == nil {
					err = c.RecvSegment(ctx, o, io.Discard)
				}
				if err == nil && o.SegmentID != "from-"+peer {
					err = errors.New("segment " + o.SegmentID + " arrived on " + peer + "'s connection")
				}
				if err == nil {
					err = c.SendAck(ctx, o.SegmentID)
				}
				if err != nil {
					serverErr <- err
					return
				}
				got <- peer
			}()
		}
	}()
	var cwg sync.WaitGroup
	for _, p := range peers {
		cli := newTransport(t, dir, p, []string{"hub"}, nil)
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			c, err := cli.Dial(ctx, srv.Addr().String(), "hub")
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			data := []byte("payload of " + p)
			sum := sha256.Sum256(data)
			o := wire.Offer{SegmentID: "from-" + p, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
			if err := c.Deliver(ctx, o, bytes.NewReader(data)); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}()
	}
	cwg.Wait()
	if t.Failed() {
		return // the cleanup closes the listener, which ends the accept loop
	}
	seen := map[string]bool{}
	for range peers {
		select {
		case p := <-got:
			seen[p] = true
		case err := <-serverErr:
			t.Fatal(err)
		}
	}
	wg.Wait()
	if len(seen) != len(peers) {
		t.Fatalf("served %v", seen)
	}
}
