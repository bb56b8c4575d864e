package relay

import (
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// pool keeps idle authenticated connections per peer, so a stream of small
// segments does not pay a TLS handshake each. Connections are used by one
// attempt at a time: get removes, put returns.
type pool struct {
	maxPerPeer int
	idle       time.Duration

	mu     sync.Mutex
	conns  map[string][]pooled
	closed bool
}

type pooled struct {
	c     *wire.Conn
	since time.Time
}

func newPool(maxPerPeer int, idle time.Duration) *pool {
	return &pool{maxPerPeer: maxPerPeer, idle: idle, conns: map[string][]pooled{}}
}

// get returns the most recently used live connection to peer, or nil.
// Connections idle for longer than the pool's limit are closed.
func (p *pool) get(peer string) *wire.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.conns[peer]
	for len(cs) > 0 {
		last := cs[len(cs)-1]
		cs = cs[:len(cs)-1]
		if time.Since(last.since) < p.idle {
			p.conns[peer] = cs
			return last.c
		}
		last.c.Close()
	}
	delete(p.conns, peer)
	return nil
}

// put returns a connection after a successful exchange.
func (p *pool) put(peer string, c *wire.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.conns[peer]) >= p.maxPerPeer {
		c.Close()
		return
	}
	p.conns[peer] = append(p.conns[peer], pooled{c: c, since: time.Now()})
}

// closeAll closes every pooled connection; later puts close theirs.
func (p *pool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for peer, cs := range p.conns {
		for _, pc := range cs {
			pc.c.Close()
		}
		delete(p.conns, peer)
	}
}
