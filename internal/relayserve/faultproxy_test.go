package relayserve

import (
	"net"
	"sync"
	"testing"
)

// faultProxy forwards TCP connections on 127.0.0.1 to a real database
// (a Unix socket or a TCP address) and can cut it off: cut closes every
// open connection and refuses new ones (accepted and closed at once)
// until restore. It is the fault around the real part, the way a
// database that goes away looks to its client.
type faultProxy struct {
	ln              net.Listener
	network, target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	// open is closed while bytes flow; stall replaces it with an open
	// channel, which resume closes: a stalled network, connections up
	// and nothing delivered either way.
	open chan struct{}
}

func newFaultProxy(t *testing.T, network, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, network: network, target: target, conns: map[net.Conn]struct{}{}, open: make(chan struct{})}
	close(p.open)
	t.Cleanup(p.resume)
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

// addr is the proxy's host:port.
func (p *faultProxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

func (p *faultProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		go p.forward(c)
	}
}

func (p *faultProxy) forward(c net.Conn) {
	up, err := net.Dial(p.network, p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				open := p.open
				p.mu.Unlock()
				<-open // held here while stalled
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// track records both ends, or closes them when the proxy went down
// meanwhile.
func (p *faultProxy) track(c, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		c.Close()
		up.Close()
		return false
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	return true
}

func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// stall stops delivering bytes in both directions, connections kept.
func (p *faultProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // stalled already
	}
}

// resume delivers again what stall held and what follows.
func (p *faultProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

func (p *faultProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
