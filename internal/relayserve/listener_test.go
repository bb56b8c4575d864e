package relayserve

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
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
