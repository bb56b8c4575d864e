package relayserve

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// The listener never hands out more than n connections at once: a
// connection beyond them is accepted only after one closes, and Close
// wakes an Accept waiting for a slot.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 2
	l := newLimitListener(inner, n, nil)
	var open, peak atomic.Int32
	accepted := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			if v := open.Add(1); v > peak.Load() {
				peak.Store(v)
			}
			accepted <- c
		}
	}()
	for range n + 2 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	var served []net.Conn
	for range n {
		served = append(served, <-accepted)
	}
	// Each close lets exactly one more in.
	for i := range 2 {
		open.Add(-1)
		served[i].Close()
		served[i].Close() // a second Close releases nothing more
		served = append(served, <-accepted)
	}
	if p := peak.Load(); p > n {
		t.Fatalf("%d connections open at once, limit %d", p, n)
	}
	l.mu.Lock()
	held := l.open
	l.mu.Unlock()
	if held != n {
		t.Fatalf("%d slots held, want %d", held, n)
	}
	l.Close()
	if err := <-acceptErr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	for _, c := range served {
		c.Close()
	}
}

// A connection is closed for room only once it has been idle for minIdle:
// one that has just turned idle (a busy HTTP/2 client's next stream is
// often on its way) is not, nor one that turned active again; the first
// to have been idle long enough is, the unauthenticated before the
// authenticated. Before, Accept closed the first connection to turn idle
// at once.
func TestLimitListenerClosesOnlyLongIdle(t *testing.T) {
	l := newTestLimitListener(t, 2)
	dial(t, l)
	authed := accept(t, l)
	dial(t, l)
	probe := accept(t, l)
	l.trackState(authed, http.StateIdle)
	l.authenticated(authed)
	l.trackState(probe, http.StateIdle)
	l.mu.Lock()
	defer l.mu.Unlock()
	t0 := innerConn(probe).since
	if v, wait := l.evictLocked(t0); v != nil || wait <= 0 || wait > l.minIdle {
		t.Fatalf("just idle: closed %v, wait %v; want none closed, a wait up to %v", v, wait, l.minIdle)
	}
	innerConn(authed).since = t0.Add(-l.minIdle)
	if v, _ := l.evictLocked(t0); v != authed {
		t.Fatalf("closed %v, want the authenticated connection, the only one idle for %v", v, l.minIdle)
	}
	innerConn(authed).evicted, l.evicting = false, 0
	if v, _ := l.evictLocked(t0.Add(l.minIdle)); v != probe {
		t.Fatalf("closed %v, want the unauthenticated connection first once both were idle for %v", v, l.minIdle)
	}
	innerConn(probe).evicted, l.evicting = false, 0
	innerConn(probe).state, innerConn(authed).state = http.StateActive, http.StateActive
	if v, wait := l.evictLocked(t0.Add(time.Hour)); v != nil || wait != 0 {
		t.Fatalf("both active: closed %v, wait %v; want none and no wait", v, wait)
	}
}

// A waiting Accept closes the connection once it has been idle for
// minIdle, with no other event to wake it, and then accepts the new one.
func TestLimitListenerWaitsForIdle(t *testing.T) {
	l := newTestLimitListener(t, 1)
	l.minIdle = 20 * time.Millisecond
	d1 := dial(t, l)
	l.trackState(accept(t, l), http.StateIdle)
	dial(t, l)
	accept(t, l)
	if _, err := d1.Read(make([]byte, 1)); err == nil {
		t.Fatal("the idle connection was not closed for room")
	}
}

// An Accept already waiting when a connection turns idle is woken by it
// (trackState) and closes it once it has been idle for minIdle: before the
// wake it had nothing to wait for but a slot freeing.
func TestLimitListenerWokenByIdle(t *testing.T) {
	l := newTestLimitListener(t, 1)
	l.minIdle = 20 * time.Millisecond
	d1 := dial(t, l)
	c1 := accept(t, l)
	l.trackState(c1, http.StateActive)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	// Accept is waiting once it has marked itself so.
	for {
		l.mu.Lock()
		w := l.waiting
		l.mu.Unlock()
		if w {
			break
		}
		time.Sleep(time.Millisecond)
	}
	dial(t, l)
	l.trackState(c1, http.StateIdle)
	if c := <-accepted; c != nil {
		c.Close()
	}
	if _, err := d1.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection that turned idle was not closed for room")
	}
}

// newTestLimitListener is a limitListener of n slots on a loopback port,
// closed at the end of the test.
func newTestLimitListener(t *testing.T, n int) *limitListener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, n, nil)
	t.Cleanup(func() { l.Close() })
	return l
}

// dial opens a client connection to l, closed at the end of the test.
func dial(t *testing.T, l *limitListener) net.Conn {
	t.Helper()
	d, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// accept is l.Accept, the connection closed at the end of the test.
func accept(t *testing.T, l *limitListener) net.Conn {
	t.Helper()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
