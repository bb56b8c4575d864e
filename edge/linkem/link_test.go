package linkem

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/relay-dev/relay/edge/pki/pkitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target listens on 127.0.0.1 and hands over the connections it accepts.
func target(t testing.TB) (net.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ln, ch
}

func newLink(t testing.TB, cfg Config) *Link {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// pair returns the two ends of one connection through a new link.
func pair(t *testing.T, cfg Config) (l *Link, client, server net.Conn) {
	t.Helper()
	ln, accepted := target(t)
	cfg.Target = ln.Addr().String()
	l = newLink(t, cfg)
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server = <-accepted
	t.Cleanup(func() { server.Close() })
	return l, client, server
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestIntactRandomChunking sends random bytes in random-sized writes both
// ways at once (the target echoes) through a slow, bounded link, and checks
// they arrive intact and in order, and that the half-close passes through.
func TestIntactRandomChunking(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	_, client, server := pair(t, Config{Latency: 2 * time.Millisecond, Bandwidth: 200e6, Buffer: 3000})

	go func() { // echo, then close once the client has closed its side
		_, _ = io.Copy(server, server)
		server.(*net.TCPConn).CloseWrite()
	}()
	data := make([]byte, 1<<20+int(rng.IntN(4096)))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var sizes []int
	for rest := len(data); rest > 0; {
		n := min(rest, 1+rng.IntN(40000))
		sizes = append(sizes, n)
		rest -= n
	}
	writeErr := make(chan error, 1)
	go func() {
		off := 0
		for _, n := range sizes {
			if _, err := client.Write(data[off : off+n]); err != nil {
				writeErr <- err
				return
			}
			off += n
		}
		writeErr <- client.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatalf("seed %d: read: %v", seed, err)
	}
	if err := <-writeErr; err != nil {
		t.Fatalf("seed %d: write: %v", seed, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("seed %d: echoed %d bytes differ from the %d sent", seed, len(got), len(data))
	}
}

// TestDelayLowerBounds checks the model's guarantees that can be checked
// without an upper time bound: a byte is delivered no earlier than Latency
// after it was sent, and n bytes take at least n·8/Bandwidth to pass.
func TestDelayLowerBounds(t *testing.T) {
	const latency = 20 * time.Millisecond
	const bw = 8e6 // 1 MB/s
	_, client, server := pair(t, Config{Latency: latency, Bandwidth: bw})

	start := time.Now()
	if _, err := client.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < latency {
		t.Fatalf("one byte arrived after %v, before the latency %v", d, latency)
	}

	const n = 100 << 10 // 100 ms of serialization
	start = time.Now()
	go server.Write(make([]byte, n))
	if _, err := io.ReadFull(client, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if d, min := time.Since(start), latency+time.Duration(n*8*float64(time.Second)/bw); d < min {
		t.Fatalf("%d bytes arrived after %v, before latency + serialization %v", n, d, min)
	}
}

// TestStallDeliversNothingUntilResumed waits (by the proxy's counters, not
// a sleep) until the stalled link holds the bytes ready to deliver, checks
// nothing was delivered, and that Resume delivers them in order.
func TestStallDeliversNothingUntilResumed(t *testing.T) {
	ctx := testCtx(t)
	l, client, server := pair(t, Config{})
	l.Stall()
	msg := []byte("held at the gate")
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitStats(ctx, func(s Stats) bool { return s.Up.Held == int64(len(msg)) }); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Up.Delivered != 0 {
		t.Fatalf("stalled link delivered %d bytes", s.Up.Delivered)
	}
	l.Resume()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %q, want %q", got, msg)
	}
	// The proxy counts a delivery after its write returns, which may be
	// after the server has read the bytes.
	if err := l.WaitStats(ctx, func(s Stats) bool { return s.Up.Held == 0 && s.Up.Delivered == int64(len(msg)) }); err != nil {
		t.Fatal(err)
	}
}

// TestBackPressureBoundsBuffer writes 1 MiB into a link whose buffer is
// 4 KiB, stalled at first: the proxy reads up to the bound and no further,
// and at every change of its counters it holds at most the bound.
func TestBackPressureBoundsBuffer(t *testing.T) {
	const bound = 4096
	const total = 1 << 20
	ctx := testCtx(t)
	l, client, server := pair(t, Config{Buffer: bound, Latency: time.Millisecond})
	l.Stall()

	var (
		mu       sync.Mutex
		worst    int64
		watchErr = make(chan error, 1)
	)
	go func() {
		watchErr <- l.WaitStats(ctx, func(s Stats) bool {
			mu.Lock()
			worst = max(worst, s.Up.Read-s.Up.Delivered)
			mu.Unlock()
			return s.Up.Delivered == total
		})
	}()
	go client.Write(make([]byte, total))
	if err := l.WaitStats(ctx, func(s Stats) bool { return s.Up.Read >= bound }); err != nil {
		t.Fatal(err)
	}
	l.Resume()
	if _, err := io.ReadFull(server, make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	if err := <-watchErr; err != nil {
		t.Fatal(err)
	}
	if worst > bound {
		t.Fatalf("proxy held %d bytes, bound %d", worst, bound)
	}
	if s := l.Stats(); s.Up.Read != total {
		t.Fatalf("read %d of %d", s.Up.Read, total)
	}
}

// exchange proves the connection works before a fault.
func exchange(t *testing.T, client, server net.Conn) {
	t.Helper()
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
}

func TestResetSurfacesOnBothEnds(t *testing.T) {
	l, client, server := pair(t, Config{Latency: time.Millisecond})
	exchange(t, client, server)
	l.Reset()
	for name, c := range map[string]net.Conn{"client": client, "server": server} {
		_, err := c.Read(make([]byte, 1))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s read after Reset: %v, want ECONNRESET", name, err)
		}
	}
}

func TestDropSurfacesOnBothEnds(t *testing.T) {
	l, client, server := pair(t, Config{Latency: time.Millisecond})
	exchange(t, client, server)
	l.Drop()
	for name, c := range map[string]net.Conn{"client": client, "server": server} {
		if _, err := io.ReadFull(c, make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("%s read after Drop: %v, want EOF", name, err)
		}
	}
}

// TestLinkReconnectsAfterFault: a reset kills the connections of the time,
// not the link.
func TestLinkReconnectsAfterFault(t *testing.T) {
	ln, accepted := target(t)
	l := newLink(t, Config{Target: ln.Addr().String()})
	for range 2 {
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		server := <-accepted
		defer server.Close()
		exchange(t, client, server)
		l.Reset()
	}
}

func TestAfterDropDeliversExactPrefix(t *testing.T) {
	l, client, server := pair(t, Config{Latency: time.Millisecond, Buffer: 1000})
	l.After(Up, 2500, FaultDrop)
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	go client.Write(data)
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[:2500]) {
		t.Fatalf("server got %d bytes, want the first 2500", len(got))
	}
	// The proxy still holds unread bytes from the client, so Linux closes
	// that socket with an RST rather than a FIN.
	if _, err := io.ReadFull(client, make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after drop: %v, want EOF or ECONNRESET", err)
	}
}

func TestAfterStallHoldsTheRest(t *testing.T) {
	ctx := testCtx(t)
	l, client, server := pair(t, Config{})
	l.After(Down, 100, FaultStall)
	data := bytes.Repeat([]byte("0123456789"), 30)
	if _, err := server.Write(data); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitStats(ctx, func(s Stats) bool { return s.Down.Read == 300 && s.Down.Held > 0 }); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Down.Delivered != 100 {
		t.Fatalf("delivered %d bytes past the stall at 100", s.Down.Delivered)
	}
	l.Resume()
	rest := make([]byte, 200)
	if _, err := io.ReadFull(client, rest); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rest, data[100:]) {
		t.Fatal("bytes after the stall differ")
	}
}

func TestAfterResetDeliversAtMostPrefix(t *testing.T) {
	l, client, server := pair(t, Config{Buffer: 1000})
	l.After(Up, 2500, FaultReset)
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i * 13)
	}
	go client.Write(data)
	got, err := io.ReadAll(server)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server read: %v, want ECONNRESET", err)
	}
	if len(got) > 2500 || !bytes.Equal(got, data[:len(got)]) {
		t.Fatalf("server got %d bytes, want a prefix of at most 2500", len(got))
	}
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after reset: %v, want ECONNRESET", err)
	}
}

// TestUnreachableTargetResetsClient: the client learns of a target that
// refuses instead of hanging.
func TestUnreachableTargetResetsClient(t *testing.T) {
	ln, _ := target(t)
	addr := ln.Addr().String()
	ln.Close()
	l := newLink(t, Config{Target: addr})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return // the reset came before connect returned
	}
	defer c.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read from a link to a closed target succeeded")
	}
}

// TestCloseStopsEverything closes a link with a stalled connection and
// bytes held; goleak (TestMain) checks no goroutine is left.
func TestCloseStopsEverything(t *testing.T) {
	ctx := testCtx(t)
	l, client, server := pair(t, Config{Latency: time.Hour})
	l.Stall()
	client.Write([]byte("x"))
	if err := l.WaitStats(ctx, func(s Stats) bool { return s.Up.Read == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 1)); err == nil {
		t.Fatal("server read a byte after Close")
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no target":        {},
		"negative latency": {Target: "127.0.0.1:1", Latency: -1},
		"negative buffer":  {Target: "127.0.0.1:1", Buffer: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if l, err := New(cfg); err == nil {
				l.Close()
				t.Fatal("New accepted it")
			}
		})
	}
}

// tlsConfigs returns a server and a client TLS 1.3 configuration made from
// pkitest certificates.
func tlsConfigs(t testing.TB) (srv, cli *tls.Config) {
	dir := pkitest.New(t, "server")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in ca.crt")
	}
	srv = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	cli = &tls.Config{RootCAs: pool, ServerName: "server", MinVersion: tls.VersionTLS13}
	return srv, cli
}

func TestTLS13ThroughLink(t *testing.T) {
	srvCfg, cliCfg := tlsConfigs(t)
	_, client, server := pair(t, Config{Latency: 5 * time.Millisecond, Bandwidth: 400e6, Buffer: 64 << 10})
	ts := tls.Server(server, srvCfg)
	tc := tls.Client(client, cliCfg)
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 31 >> 2)
	}
	srvErr := make(chan error, 1)
	go func() { // echo one message back
		buf := make([]byte, len(data))
		if _, err := io.ReadFull(ts, buf); err != nil {
			srvErr <- err
			return
		}
		_, err := ts.Write(buf)
		srvErr <- err
	}()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if v := tc.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Fatalf("TLS version %x, want 1.3", v)
	}
	if _, err := tc.Write(data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(tc, got); err != nil {
		t.Fatal(err)
	}
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("TLS echo differs")
	}
}
