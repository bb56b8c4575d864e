package relayserve

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// limitListener accepts at most n connections at once, and keeps idle
// ones from holding the slots.
//
// A connection beyond n waits in the kernel's accept queue until a slot
// frees. With the header and read timeouts this bounds what slow clients
// can hold: n connections, each for at most limits.read_header_timeout
// before its request is read. An idle keep-alive connection has no such
// bound (limits.idle_timeout, 120 s, starts again after each request),
// so 512 clients that each sent one GET /healthz and then sat idle held
// every slot, and a real request waited for minutes. So when every slot
// is taken and Accept waits (it reserves the slot of the next connection
// before that one arrives), the listener closes an idle connection to
// make room: one that never carried an authenticated request first (a
// health probe's, or an attacker's), then the one idle longest. A
// connection busy with a request is never closed for room; when none is
// idle, the first to become idle is. Closing an idle connection is what
// idle_timeout does anyway: HTTP clients expect it and open another.
//
// The connection states come from http.Server.ConnState (trackState),
// which reports HTTP/2 connections as idle when no stream is open;
// authenticated (called by the handler) marks a connection that carried
// an authenticated request.
type limitListener struct {
	net.Listener
	n         int
	done      chan struct{}
	closeOnce sync.Once
	// wake gets a token when a slot frees (Accept re-checks).
	wake chan struct{}
	// onEvict counts a connection closed for room (a metric).
	onEvict func()

	mu       sync.Mutex
	open     int // slots taken: connections open, and Accept's reservation
	waiting  bool
	evicting int // connections closed for room, not yet gone
	conns    map[*limitConn]struct{}
}

func newLimitListener(l net.Listener, n int, onEvict func()) *limitListener {
	if onEvict == nil {
		onEvict = func() {}
	}
	return &limitListener{Listener: l, n: n, done: make(chan struct{}), wake: make(chan struct{}, 1), onEvict: onEvict,
		conns: map[*limitConn]struct{}{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.open < l.n {
			l.open++
			l.waiting = false
			l.mu.Unlock()
			break
		}
		l.waiting = true
		victim := l.evictLocked()
		l.mu.Unlock()
		l.close(victim)
		select {
		case <-l.wake:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.release(nil)
		return nil, err
	}
	lc := &limitConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// evictLocked picks the connection to close for room, if one is idle and
// none is already closing for room (its slot is on its way), and marks it.
func (l *limitListener) evictLocked() net.Conn {
	if l.evicting > 0 {
		return nil
	}
	var best *limitConn
	for c := range l.conns {
		if c.state != http.StateIdle || c.outer == nil || c.evicted {
			continue
		}
		if best == nil || !c.authed && best.authed || c.authed == best.authed && c.since.Before(best.since) {
			best = c
		}
	}
	if best == nil {
		return nil
	}
	best.evicted = true
	l.evicting++
	return best.outer
}

// close closes a connection picked for room (nil: none), off the caller's
// goroutine: a TLS close writes an alert, which a peer that does not read
// could hold up.
func (l *limitListener) close(c net.Conn) {
	if c == nil {
		return
	}
	l.onEvict()
	go c.Close()
}

// release frees c's slot (nil: Accept's reservation) and wakes Accept.
func (l *limitListener) release(c *limitConn) {
	l.mu.Lock()
	l.open--
	if c != nil {
		delete(l.conns, c)
		if c.evicted {
			l.evicting--
		}
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// trackState is the http.Server's ConnState hook: it records each
// connection's state, and an Accept waiting for a slot gets the first
// connection to turn idle.
func (l *limitListener) trackState(outer net.Conn, state http.ConnState) {
	c := innerConn(outer)
	if c == nil {
		return
	}
	l.mu.Lock()
	c.outer, c.state, c.since = outer, state, time.Now()
	var victim net.Conn
	if state == http.StateIdle && l.waiting {
		victim = l.evictLocked()
	}
	l.mu.Unlock()
	l.close(victim)
}

// authenticated marks the connection (the server's, as ConnContext got
// it) as having carried an authenticated request: it is closed for room
// only after the idle connections that have not.
func (l *limitListener) authenticated(outer net.Conn) {
	if c := innerConn(outer); c != nil {
		l.mu.Lock()
		c.authed = true
		l.mu.Unlock()
	}
}

// innerConn finds the listener's connection under the server's (a TLS
// connection wraps it).
func innerConn(c net.Conn) *limitConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitConn)
	return lc
}

// limitConn is an accepted connection; its fields other than Conn, l and
// once are guarded by l.mu.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once

	outer   net.Conn // the server's connection (TLS over this one), from ConnState
	state   http.ConnState
	since   time.Time // when it entered state
	authed  bool
	evicted bool
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// Close closes the listener and wakes an Accept waiting for a free slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}
