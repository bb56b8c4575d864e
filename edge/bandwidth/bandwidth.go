// Package bandwidth bounds the bytes the edge agent sends, per peer and in
// total (relay.bandwidth.per_peer, relay.bandwidth.total), with token
// buckets (golang.org/x/time/rate) applied to the writes of the raw TCP
// connection under TLS. It knows nothing of the wire protocol: what it
// counts is what leaves the socket, TLS records and framing included, so
// the limit is the one an operator measures on the link.
//
// # Model
//
// Each bucket refills at its rate and holds at most Burst(rate) bytes
// (50 ms worth, at least MinBurst). A write is cut into chunks of at most
// MinBurst bytes; before each chunk goes out it takes that many tokens
// from the peer's bucket and from the total bucket at once, and waits
// until both have them. So over any interval I the bytes sent to one peer
// are at most Burst + rate·I, and likewise for all peers together.
// Waiting is ordered by arrival at the bucket (a reservation), not by a
// random choice; with a fake Clock the schedule is exactly reproducible.
//
// # Deadlines
//
// The wire layer arms a write deadline before each write (its idle
// timeout). Time spent waiting for tokens is not idleness: after each wait
// the connection's write deadline is moved later by the time waited, so a
// throttled link is not cut as dead. A deadline set in the past (how the
// wire layer cancels an operation) or Close interrupts a wait at once,
// returning os.ErrDeadlineExceeded or net.ErrClosed, and gives the tokens
// back.
package bandwidth

import (
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// MinBurst is the largest chunk written at once and the smallest bucket:
// one TLS record's payload.
const MinBurst = 16 << 10

// Burst is the bucket size for a rate of bytesPerSec: 50 ms worth of
// bytes, at least MinBurst.
func Burst(bytesPerSec int64) int {
	return int(max(bytesPerSec/20, MinBurst))
}

// Clock is the time source; tests use a fake one.
type Clock interface {
	Now() time.Time
	// After delivers once d has passed.
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Limits holds the total bucket and one bucket per peer. The zero rates
// mean no limit. Safe for concurrent use.
type Limits struct {
	clock   Clock
	total   *rate.Limiter // nil: no total limit
	perPeer int64         // bytes per second; 0: none
	// overrides are peers' own rates (known_peers[].bandwidth).
	overrides map[string]int64
	// OnWait, if set, is told how long a write to peer waited for tokens
	// (for edged_relay_throttled_seconds_total).
	OnWait func(peer string, d time.Duration)

	mu    sync.Mutex
	peers map[string]*rate.Limiter
}

// New returns Limits for total and per-peer rates in bytes per second (0:
// unlimited), on clock (nil: the system clock). overrides gives some
// peers a rate of their own instead of perPeer.
func New(total, perPeer int64, overrides map[string]int64, clock Clock) *Limits {
	if clock == nil {
		clock = systemClock{}
	}
	l := &Limits{clock: clock, perPeer: perPeer, overrides: overrides, peers: map[string]*rate.Limiter{}}
	if total > 0 {
		l.total = bucket(total, clock.Now())
	}
	return l
}

// bucket starts full: a connection may send its first burst at once.
func bucket(bytesPerSec int64, now time.Time) *rate.Limiter {
	lim := rate.NewLimiter(rate.Limit(bytesPerSec), Burst(bytesPerSec))
	lim.SetLimitAt(now, rate.Limit(bytesPerSec)) // anchors the bucket at now for a fake clock
	return lim
}

// buckets returns the buckets a write to peer draws from.
func (l *Limits) buckets(peer string) []*rate.Limiter {
	var out []*rate.Limiter
	if r := l.peerRate(peer); r > 0 {
		l.mu.Lock()
		b := l.peers[peer]
		if b == nil {
			b = bucket(r, l.clock.Now())
			l.peers[peer] = b
		}
		l.mu.Unlock()
		out = append(out, b)
	}
	if l.total != nil {
		out = append(out, l.total)
	}
	return out
}

// peerRate is peer's own rate: its override, else perPeer.
func (l *Limits) peerRate(peer string) int64 {
	if r, ok := l.overrides[peer]; ok && r > 0 {
		return r
	}
	return l.perPeer
}

// Wrap returns c with its writes limited for peer; c itself when no limit
// applies. All connections to one peer share its bucket.
func (l *Limits) Wrap(peer string, c net.Conn) net.Conn {
	if l == nil || (l.total == nil && l.peerRate(peer) <= 0) {
		return c
	}
	return &conn{Conn: c, l: l, peer: peer, buckets: l.buckets(peer), wake: make(chan struct{})}
}

// conn limits Write; reads pass through.
type conn struct {
	net.Conn
	l       *Limits
	peer    string
	buckets []*rate.Limiter

	mu       sync.Mutex
	deadline time.Time     // the write deadline as the caller set it
	waited   time.Duration // waited for tokens since it was set
	wake     chan struct{} // closed when the deadline changes or on Close
	closed   bool
}

func (c *conn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), MinBurst)
		if err := c.wait(k); err != nil {
			return n, err
		}
		m, err := c.Conn.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// wait takes k tokens from every bucket and returns once all had them.
func (c *conn) wait(k int) error {
	now := c.l.clock.Now()
	var delay time.Duration
	rs := make([]*rate.Reservation, 0, len(c.buckets))
	for _, b := range c.buckets {
		r := b.ReserveN(now, k) // k ≤ MinBurst ≤ every burst: always ok
		rs = append(rs, r)
		delay = max(delay, r.DelayFrom(now))
	}
	if delay <= 0 {
		return nil
	}
	giveBack := func() {
		at := c.l.clock.Now()
		for _, r := range rs {
			r.CancelAt(at)
		}
	}
	c.mu.Lock()
	wake, closed, d := c.wake, c.closed, c.deadline
	c.mu.Unlock()
	if err := interrupted(closed, d, now); err != nil {
		giveBack()
		return err
	}
	timer := c.l.clock.After(delay)
	for {
		select {
		case <-timer:
			c.mu.Lock()
			c.waited += delay
			if !c.deadline.IsZero() {
				_ = c.Conn.SetWriteDeadline(c.deadline.Add(c.waited))
			}
			c.mu.Unlock()
			if f := c.l.OnWait; f != nil {
				f(c.peer, delay)
			}
			return nil
		case <-wake:
			c.mu.Lock()
			wake, closed, d = c.wake, c.closed, c.deadline
			c.mu.Unlock()
			if err := interrupted(closed, d, c.l.clock.Now()); err != nil {
				giveBack()
				return err
			}
		}
	}
}

func interrupted(closed bool, deadline, now time.Time) error {
	switch {
	case closed:
		return net.ErrClosed
	case !deadline.IsZero() && !deadline.After(now):
		return os.ErrDeadlineExceeded
	}
	return nil
}

func (c *conn) setWrite(t time.Time) {
	c.deadline, c.waited = t, 0
	close(c.wake)
	c.wake = make(chan struct{})
}

func (c *conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setWrite(t)
	return c.Conn.SetDeadline(t)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setWrite(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *conn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.wake)
		c.wake = make(chan struct{})
	}
	c.mu.Unlock()
	return c.Conn.Close()
}
