package linkem

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// conn is one proxied connection: two pipes, one per direction.
type conn struct {
	l              *Link
	client, target *net.TCPConn

	abortOnce sync.Once
	done      chan struct{} // closed when the connection is aborted
}

type chunk struct {
	b  []byte
	at time.Time // due at the receiver
}

// pipe carries one direction: a reader goroutine queues chunks with their
// due times, a writer goroutine delivers them in order.
type pipe struct {
	c        *conn
	d        Direction
	src, dst *net.TCPConn

	mu       sync.Mutex
	cond     sync.Cond
	q        []chunk
	buffered int
	srcErr   error // set when the reader stops; io.EOF for a clean half-close
	stopped  bool  // the connection was aborted
	exited   bool  // the writer has returned
}

func (c *conn) run() {
	up := c.newPipe(Up, c.client, c.target)
	down := c.newPipe(Down, c.target, c.client)
	var wg sync.WaitGroup
	for _, p := range []*pipe{up, down} {
		wg.Add(2)
		go func() { defer wg.Done(); p.read() }()
		go func() { defer wg.Done(); p.write() }()
	}
	// Stop the pipes' waits when the connection is aborted.
	stopWatch := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-c.done:
			up.stop()
			down.stop()
		case <-stopWatch:
		}
	}()
	up.waitWriter()
	down.waitWriter()
	// Both directions finished cleanly (or by abort): close both ends.
	c.abort(false)
	close(stopWatch)
	wg.Wait()
}

func (c *conn) newPipe(d Direction, src, dst *net.TCPConn) *pipe {
	p := &pipe{c: c, d: d, src: src, dst: dst}
	p.cond.L = &p.mu
	return p
}

// abort closes both ends once; with rst, as a TCP reset.
func (c *conn) abort(rst bool) {
	c.abortOnce.Do(func() {
		if rst {
			_ = c.client.SetLinger(0)
			_ = c.target.SetLinger(0)
		}
		c.client.Close()
		c.target.Close()
		close(c.done)
	})
}

func (p *pipe) stop() {
	p.mu.Lock()
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// waitWriter blocks until the writer has returned: everything delivered
// and the half-close passed on, or the connection aborted.
func (p *pipe) waitWriter() {
	p.mu.Lock()
	for !p.exited {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

func (p *pipe) read() {
	bound := p.c.l.cfg.Buffer
	for {
		p.mu.Lock()
		for bound > 0 && p.buffered >= bound && !p.stopped {
			p.cond.Wait()
		}
		if p.stopped {
			p.mu.Unlock()
			return
		}
		n := maxChunk
		if bound > 0 && bound-p.buffered < n {
			n = bound - p.buffered
		}
		p.mu.Unlock()

		buf := make([]byte, n)
		k, err := p.src.Read(buf)
		if k > 0 {
			at := p.c.l.schedule(p.d, time.Now(), k)
			// Counted before the writer can see the chunk, so that
			// Delivered never exceeds Read in a snapshot.
			p.c.l.update(func(s *Stats) { s.dir(p.d).Read += int64(k) })
			p.mu.Lock()
			p.q = append(p.q, chunk{b: buf[:k], at: at})
			p.buffered += k
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		if err != nil {
			p.mu.Lock()
			p.srcErr = err
			p.cond.Broadcast()
			p.mu.Unlock()
			if !errors.Is(err, io.EOF) {
				// The sender reset or the socket broke: pass the
				// failure on rather than pretend a clean close.
				p.c.abort(true)
			}
			return
		}
	}
}

func (p *pipe) write() {
	defer func() {
		p.mu.Lock()
		p.exited = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	l := p.c.l
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		p.mu.Lock()
		for len(p.q) == 0 && p.srcErr == nil && !p.stopped {
			p.cond.Wait()
		}
		if p.stopped {
			p.mu.Unlock()
			return
		}
		if len(p.q) == 0 {
			// The sender closed its side and everything is delivered:
			// pass the half-close on.
			p.mu.Unlock()
			if errors.Is(p.srcErr, io.EOF) {
				_ = p.dst.CloseWrite()
			}
			return
		}
		ch := p.q[0]
		p.mu.Unlock()

		if wait := time.Until(ch.at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-p.c.done:
				return
			}
		}
		allowed, fault, ok := l.reserve(p.d, len(ch.b), p.c.done)
		if !ok {
			return
		}
		k, err := p.dst.Write(ch.b[:allowed])
		// Count the delivery before freeing buffer space, so that Read −
		// Delivered never exceeds Buffer in any snapshot of the counters.
		l.update(func(s *Stats) { s.dir(p.d).Delivered += int64(k) })
		p.mu.Lock()
		p.q[0].b = p.q[0].b[k:]
		if len(p.q[0].b) == 0 {
			p.q = p.q[1:]
		}
		p.buffered -= k
		p.cond.Broadcast()
		p.mu.Unlock()
		if fault != 0 {
			l.apply(p.d, fault)
		}
		if err != nil {
			p.c.abort(true)
			return
		}
	}
}
