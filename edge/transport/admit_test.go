package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// addrConn is a net.Conn that only has a remote address: what admission
// looks at.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func tcpFrom(ip string, port int) net.Conn {
	return addrConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
}

// TestAdmissionRules: the per-address cap, the wait while no handshake is
// old enough to give up, the choice of victim (the address holding the
// most, its oldest) and authenticated connections never being evicted,
// on a clock the test sets.
func TestAdmissionRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := newAdmission(4, 2, time.Second)
	mustAdmit := func(c net.Conn, now time.Time) *pending {
		t.Helper()
		p, victim, wait, err := a.admit(c, now)
		if err != nil || victim != nil || wait != 0 || p == nil {
			t.Fatalf("admit %v: p=%v victim=%v wait=%v err=%v, want admitted", c.RemoteAddr(), p, victim, wait, err)
		}
		return p
	}
	x1 := mustAdmit(tcpFrom("10.0.0.1", 1), t0)
	x2 := mustAdmit(tcpFrom("10.0.0.1", 2), t0.Add(10*time.Millisecond))
	if _, _, _, err := a.admit(tcpFrom("10.0.0.1", 3), t0); !errors.Is(err, ErrAddressBusy) {
		t.Fatalf("third from one address: %v, want ErrAddressBusy", err)
	}
	// An IPv6 /64 is one address; another /64 is not.
	mustAdmit(tcpFrom("2001:db8:0:1::1", 1), t0.Add(20*time.Millisecond))
	y := mustAdmit(tcpFrom("2001:db8:0:1::2", 1), t0.Add(30*time.Millisecond))
	if _, _, _, err := a.admit(tcpFrom("2001:db8:0:1:ffff::9", 1), t0); !errors.Is(err, ErrAddressBusy) {
		t.Fatalf("third from one /64: %v, want ErrAddressBusy", err)
	}

	// Full: an address holding as many as any other loses its newcomer.
	if _, _, _, err := a.admit(tcpFrom("10.0.0.1", 4), t0.Add(5*time.Second)); !errors.Is(err, ErrAddressBusy) {
		t.Fatalf("full, from an address holding the most: %v, want ErrAddressBusy", err)
	}
	// Full, and nothing has run a second yet: wait until the oldest has.
	_, victim, wait, err := a.admit(tcpFrom("192.0.2.7", 1), t0.Add(400*time.Millisecond))
	if err != nil || victim != nil || wait != 600*time.Millisecond {
		t.Fatalf("full and young: victim=%v wait=%v err=%v, want a wait of 600ms", victim, wait, err)
	}
	// Authenticated ones are never given up, and free their address's
	// share: the IPv6 host may start another.
	if !a.authenticated(y) {
		t.Fatal("authenticated: evicted?")
	}
	// Old enough: the victim comes from the address with the most
	// unfinished (10.0.0.1, two) and is its oldest.
	p, victim, wait, err := a.admit(tcpFrom("192.0.2.7", 1), t0.Add(2*time.Second))
	if err != nil || p == nil || victim != x1 || wait != 0 {
		t.Fatalf("full and old: p=%v victim=%v wait=%v err=%v, want x1 evicted", p, victim, wait, err)
	}
	if !a.evicted(x1) || a.authenticated(x1) {
		t.Fatal("x1 not marked evicted")
	}
	a.release(x1) // its goroutine's release is a no-op now
	if admitted, handshaking := a.counts(); admitted != 4 || handshaking != 3 {
		t.Fatalf("counts = %d admitted, %d handshaking; want 4, 3", admitted, handshaking)
	}
	// y no longer counts against its /64, but the /64 holds as many
	// unfinished as any address while all slots are taken: its newcomer
	// is shed. One from elsewhere gets the slot of the oldest of the
	// addresses tied at one (x2).
	if _, _, _, err := a.admit(tcpFrom("2001:db8:0:1::3", 1), t0.Add(2*time.Second)); !errors.Is(err, ErrAddressBusy) {
		t.Fatalf("tied address while full: %v, want ErrAddressBusy", err)
	}
	if p, victim, _, err := a.admit(tcpFrom("198.51.100.1", 1), t0.Add(2*time.Second)); err != nil || p == nil || victim != x2 {
		t.Fatalf("tie: p=%v victim=%v err=%v, want x2 evicted", p, victim, err)
	}
}

// dialFrom opens a TCP connection to addr from the loopback address src
// (any of 127.0.0.0/8 is this host on Linux) and sends nothing.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	c, err := tryDialFrom(src, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tryDialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.Dial("tcp", addr)
}

// TestSilentFloodOneAddress: connections from one address that never send
// a ClientHello take at most MaxPendingPerAddress slots; the rest are shed
// at once, and a configured peer on another address is served although
// the flood's connections would each wait an hour for their handshake.
// Before the per-address cap the four slots were the flood's and the
// peer's dial ran into its 10 s handshake timeout.
func TestSilentFloodOneAddress(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	rj := newRejects()
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, func(c *Config) {
		c.OnReject = rj.add
		c.HandshakeTimeout = time.Hour
		c.MaxPendingHandshakes = 4
		c.MaxPendingPerAddress = 2
	}))
	for range 10 {
		// A shed connection may be reset before connect returns.
		if c, err := tryDialFrom("127.0.0.2", srv.Addr().String()); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	cli := newTransport(t, dir, "b", []string{"a"}, nil)
	accepted := acceptAsync(srv)
	c, err := cli.Dial(context.Background(), srv.Addr().String(), "a")
	if err != nil {
		t.Fatalf("dial under a flood from another address: %v", err)
	}
	defer c.Close()
	res := <-accepted
	if res.err != nil || res.peer != "b" {
		t.Fatalf("Accept = %q, %v", res.peer, res.err)
	}
	res.conn.Close()
	for range 8 {
		if err := <-rj.ch; !errors.Is(err, ErrAddressBusy) {
			t.Fatalf("shed connection reported as %v, want ErrAddressBusy", err)
		}
	}
	if _, handshaking := srv.Pending(); handshaking != 2 {
		t.Fatalf("%d handshaking; want the flood's 2", handshaking)
	}
}

// TestSilentFloodManyAddresses: a flood from enough addresses to take
// every slot; the peer's connection gets the slot of the oldest silent
// one (the handshakes may be given up at once here: EvictAfter is 1ns).
func TestSilentFloodManyAddresses(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	rj := newRejects()
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, func(c *Config) {
		c.OnReject = rj.add
		c.HandshakeTimeout = time.Hour
		c.MaxPendingHandshakes = 4
		c.MaxPendingPerAddress = 2
		c.EvictAfter = time.Nanosecond
	}))
	first := dialFrom(t, "127.0.0.2", srv.Addr().String())
	dialFrom(t, "127.0.0.3", srv.Addr().String())
	dialFrom(t, "127.0.0.3", srv.Addr().String())
	dialFrom(t, "127.0.0.2", srv.Addr().String())
	cli := newTransport(t, dir, "b", []string{"a"}, nil)
	accepted := acceptAsync(srv)
	c, err := cli.Dial(context.Background(), srv.Addr().String(), "a")
	if err != nil {
		t.Fatalf("dial with every slot taken by silent connections: %v", err)
	}
	defer c.Close()
	if res := <-accepted; res.err != nil || res.peer != "b" {
		t.Fatalf("Accept = %q, %v", res.peer, res.err)
	} else {
		res.conn.Close()
	}
	if err := <-rj.ch; !errors.Is(err, ErrHandshakeEvicted) {
		t.Fatalf("reported %v, want ErrHandshakeEvicted", err)
	}
	// The oldest silent connection (from 127.0.0.2, tied for the most)
	// is the one that was reset.
	first.SetReadDeadline(time.Now().Add(time.Minute))
	var ne net.Error
	if _, err := first.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("oldest silent connection still open: %v", err)
	}
}
