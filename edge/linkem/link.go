package linkem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Direction names one direction of a link.
type Direction int

const (
	// Up is client → target.
	Up Direction = iota
	// Down is target → client.
	Down
)

func (d Direction) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Fault is what [Link.After] does once its byte count is reached.
type Fault int

const (
	// FaultStall stops delivery in the trigger's direction only (the other
	// keeps flowing) until [Link.Resume].
	FaultStall Fault = iota + 1
	// FaultReset resets every connection, as [Link.Reset].
	FaultReset
	// FaultDrop closes every connection, as [Link.Drop].
	FaultDrop
)

// maxChunk is the most the proxy reads at once, and so the granularity of
// the delivery schedule.
const maxChunk = 16 << 10

// Config describes the emulated link. The zero values of Latency, Bandwidth
// and Buffer mean none, unlimited and unbounded.
type Config struct {
	// Target is the host:port every accepted connection is forwarded to.
	Target string
	// Latency is the one-way delay of each direction.
	Latency time.Duration
	// Bandwidth is each direction's rate in bits per second.
	Bandwidth int64
	// Buffer bounds the bytes per connection and direction read but not yet
	// delivered.
	Buffer int
}

// DirStats counts one direction's bytes over all connections of a link.
type DirStats struct {
	// Read is the bytes the proxy has read from the sender.
	Read int64
	// Delivered is the bytes the proxy has written to the receiver.
	Delivered int64
	// Held is the bytes due for delivery but held at a stalled gate.
	Held int64
}

// Stats is a snapshot of a link's counters.
type Stats struct {
	Up, Down DirStats
	// Conns is the number of connections currently open.
	Conns int
	// Accepted is the number of connections accepted so far.
	Accepted int
}

// Dir returns the counters of direction d.
func (s Stats) Dir(d Direction) DirStats {
	if d == Up {
		return s.Up
	}
	return s.Down
}

type trigger struct {
	remaining int64
	fault     Fault
}

// Link is a running emulated link. Its methods are safe for concurrent use.
type Link struct {
	cfg    Config
	ln     net.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	conns    map[*conn]struct{}
	stalled  [2]bool
	gate     [2]chan struct{} // closed while the direction is open
	txFree   [2]time.Time     // when each direction's transmitter is next idle
	trig     [2]*trigger
	stats    Stats
	changed  chan struct{} // closed and replaced on every change of stats
	isClosed bool
}

// New starts a link listening on 127.0.0.1:0 that forwards to cfg.Target.
func New(cfg Config) (*Link, error) {
	if cfg.Target == "" {
		return nil, errors.New("linkem: Config.Target is empty")
	}
	if cfg.Latency < 0 || cfg.Bandwidth < 0 || cfg.Buffer < 0 {
		return nil, fmt.Errorf("linkem: negative Latency, Bandwidth or Buffer in %+v", cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("linkem: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Link{cfg: cfg, ln: ln, ctx: ctx, cancel: cancel, conns: map[*conn]struct{}{}, changed: make(chan struct{})}
	for d := range l.gate {
		l.gate[d] = make(chan struct{})
		close(l.gate[d])
	}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address clients dial instead of Target.
func (l *Link) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting, closes every connection and waits for all the
// link's goroutines to return.
func (l *Link) Close() error {
	l.mu.Lock()
	l.isClosed = true
	conns := l.snapshotLocked()
	for d := range l.gate { // wake writers held at a stalled gate
		if l.stalled[d] {
			close(l.gate[d])
			l.stalled[d] = false
		}
	}
	l.mu.Unlock()
	l.cancel()
	err := l.ln.Close()
	for _, c := range conns {
		c.abort(false)
	}
	l.wg.Wait()
	return err
}

// Stall stops delivery in both directions until Resume. Bytes already
// written to the receivers' sockets are not recalled.
func (l *Link) Stall() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stallLocked(Up)
	l.stallLocked(Down)
}

// Resume reopens a stalled link; held bytes are delivered in order, each no
// earlier than its schedule.
func (l *Link) Resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for d := range l.stalled {
		if l.stalled[d] {
			l.stalled[d] = false
			close(l.gate[d])
		}
	}
}

func (l *Link) stallLocked(d Direction) {
	if !l.stalled[d] && !l.isClosed {
		l.stalled[d] = true
		l.gate[d] = make(chan struct{})
	}
}

// Reset aborts every current connection with an RST to both ends.
func (l *Link) Reset() { l.kill(true) }

// Drop closes every current connection on both ends.
func (l *Link) Drop() { l.kill(false) }

func (l *Link) kill(rst bool) {
	l.mu.Lock()
	conns := l.snapshotLocked()
	l.mu.Unlock()
	for _, c := range conns {
		c.abort(rst)
	}
}

// After arms fault f to fire once exactly n more bytes (n ≥ 1) have been
// delivered in direction d, counted over all connections: the proxy writes
// the n-th byte, and writes nothing more in d until the fault has been
// applied. It replaces a trigger armed earlier for d. Bytes handed to the
// kernel before an RST may still be discarded by it, so after FaultReset the
// receiver sees at most n bytes; after FaultDrop it sees exactly n.
func (l *Link) After(d Direction, n int64, f Fault) {
	if n < 1 {
		panic("linkem: After needs n ≥ 1")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.trig[d] = &trigger{remaining: n, fault: f}
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// WaitStats blocks until cond holds for the link's counters, or ctx ends.
// It is how a test waits for the proxy to reach a state without sleeping.
func (l *Link) WaitStats(ctx context.Context, cond func(Stats) bool) error {
	for {
		l.mu.Lock()
		s, ch := l.stats, l.changed
		l.mu.Unlock()
		if cond(s) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("linkem: wait for stats (last %+v): %w", s, ctx.Err())
		}
	}
}

// update applies f to the counters under the lock and wakes WaitStats.
func (l *Link) updateLocked(f func(*Stats)) {
	f(&l.stats)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *Link) update(f func(*Stats)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.updateLocked(f)
}

func (l *Link) snapshotLocked() []*conn {
	out := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		out = append(out, c)
	}
	return out
}

// schedule returns when a chunk of n bytes read at now in direction d is
// due at the receiver: serialization after the transmitter is free, then
// the latency.
func (l *Link) schedule(d Direction, now time.Time, n int) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := now
	if l.txFree[d].After(start) {
		start = l.txFree[d]
	}
	if bw := l.cfg.Bandwidth; bw > 0 {
		start = start.Add(time.Duration(int64(n) * 8 * int64(time.Second) / bw))
	}
	l.txFree[d] = start
	return start.Add(l.cfg.Latency)
}

// reserve waits until direction d's gate is open and returns how many of n
// bytes may be written now (fewer when a trigger is about to fire) and the
// fault to apply after writing them, if any. ok is false if the link or the
// connection closed while waiting.
func (l *Link) reserve(d Direction, n int, done <-chan struct{}) (allowed int, fire Fault, ok bool) {
	held := false
	defer func() {
		if held {
			l.update(func(s *Stats) { s.dir(d).Held -= int64(n) })
		}
	}()
	for {
		l.mu.Lock()
		if !l.stalled[d] {
			allowed = n
			if t := l.trig[d]; t != nil {
				if int64(allowed) >= t.remaining {
					allowed = int(t.remaining)
					fire = t.fault
					l.trig[d] = nil
					// Nothing more in d until the fault is applied.
					l.stallLocked(d)
				} else {
					t.remaining -= int64(allowed)
				}
			}
			l.mu.Unlock()
			return allowed, fire, true
		}
		gate := l.gate[d]
		if !held {
			held = true
			l.updateLocked(func(s *Stats) { s.dir(d).Held += int64(n) })
		}
		l.mu.Unlock()
		select {
		case <-gate:
		case <-done:
			return 0, 0, false
		}
	}
}

// apply carries out a fault fired by reserve in direction d.
func (l *Link) apply(d Direction, f Fault) {
	switch f {
	case FaultStall:
		return // reserve already closed the gate
	case FaultReset:
		l.kill(true)
	case FaultDrop:
		l.kill(false)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stalled[d] {
		l.stalled[d] = false
		close(l.gate[d])
	}
}

func (s *Stats) dir(d Direction) *DirStats {
	if d == Up {
		return &s.Up
	}
	return &s.Down
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.wg.Add(1)
		go l.serve(nc.(*net.TCPConn))
	}
}

func (l *Link) serve(client *net.TCPConn) {
	defer l.wg.Done()
	var d net.Dialer
	tc, err := d.DialContext(l.ctx, "tcp", l.cfg.Target)
	if err != nil {
		// The target is unreachable: the client sees a reset, as it would
		// from a real link that cannot connect onward.
		_ = client.SetLinger(0)
		client.Close()
		return
	}
	c := &conn{l: l, client: client, target: tc.(*net.TCPConn), done: make(chan struct{})}
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		c.client.Close()
		c.target.Close()
		return
	}
	l.conns[c] = struct{}{}
	l.updateLocked(func(s *Stats) { s.Conns++; s.Accepted++ })
	l.mu.Unlock()
	c.run()
	l.mu.Lock()
	delete(l.conns, c)
	l.updateLocked(func(s *Stats) { s.Conns-- })
	l.mu.Unlock()
}
