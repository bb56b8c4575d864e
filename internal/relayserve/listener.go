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
// connection busy with a request is never closed for room, and neither is
// one idle for less than minIdleForRoom: a busy client's next request is
// often on its way already (an HTTP/2 client's streams follow each other
// within milliseconds), and closing the connection under it loses that
// request with no way for the client to know whether it ran. Before, the
// first connection to turn idle was closed at once: a client opening 300
// requests at once (Go's transport dials one connection per waiting
// request) filled the slots with its own dials, and its two HTTP/2
// connections were closed between streams, failing 25 requests with
// "unexpected EOF". When no connection has been idle that long, Accept
// waits for the first to get there (or for a slot to free). Closing a
// connection idle that long is what idle_timeout does anyway: HTTP
// clients expect it and open another.
//
// The connection states come from http.Server.ConnState (trackState),
// which reports HTTP/2 connections as idle when no stream is open;
// authenticated (called by the handler) marks a connection that carried
// an authenticated request.
type limitListener struct {
	net.Listener
	n int
	// minIdle is how long a connection must have been idle before it may
	// be closed for room (minIdleForRoom; tests set less).
	minIdle   time.Duration
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
	return &limitListener{Listener: l, n: n, minIdle: minIdleForRoom, done: make(chan struct{}), wake: make(chan struct{}, 1),
		onEvict: onEvict, conns: map[*limitConn]struct{}{}}
}

// minIdleForRoom is how long a connection must have been idle before the
// listener closes it to make room: long against the gap between a busy
// client's requests, short against idle_timeout and against how long a
// waiting client will wait.
const minIdleForRoom = time.Second

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
		victim, wait := l.evictLocked(time.Now())
		l.mu.Unlock()
		l.close(victim)
		// A connection idle for less than minIdle is due in wait; a
		// connection turning idle, or one closing, wakes this loop.
		if !l.await(wait) {
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

// await waits for a wake, or for wait to pass (0: no deadline); false:
// the listener closed.
func (l *limitListener) await(wait time.Duration) bool {
	var due <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		due = t.C
	}
	select {
	case <-l.wake:
	case <-due:
	case <-l.done:
		return false
	}
	return true
}

// evictLocked picks the connection to close for room at now, if one has
// been idle for minIdle and none is already closing for room (its slot is
// on its way), and marks it. With none to close, wait is how long until
// the first idle connection has been idle for minIdle (0: none is idle,
// or one is closing).
func (l *limitListener) evictLocked(now time.Time) (victim net.Conn, wait time.Duration) {
	if l.evicting > 0 {
		return nil, 0
	}
	var best *limitConn
	for c := range l.conns {
		if c.state != http.StateIdle || c.outer == nil || c.evicted {
			continue
		}
		if left := c.since.Add(l.minIdle).Sub(now); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		if best == nil || !c.authed && best.authed || c.authed == best.authed && c.since.Before(best.since) {
			best = c
		}
	}
	if best == nil {
		return nil, wait
	}
	best.evicted = true
	l.evicting++
	return best.outer, 0
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
// connection's state, and wakes an Accept waiting for a slot when one
// turns idle (Accept closes it once it has been idle for minIdle).
func (l *limitListener) trackState(outer net.Conn, state http.ConnState) {
	c := innerConn(outer)
	if c == nil {
		return
	}
	l.mu.Lock()
	c.outer, c.state, c.since = outer, state, time.Now()
	waiting := l.waiting
	l.mu.Unlock()
	if state == http.StateIdle && waiting {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
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
