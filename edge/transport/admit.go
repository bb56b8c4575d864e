package transport

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Errors OnReject reports for connections the listener sheds before their
// handshake could finish (see admission). Neither says anything about a
// peer: the connection had not authenticated.
var (
	// ErrAddressBusy: the connection came from an address that already
	// has Config.MaxPendingPerAddress handshakes unfinished, or, while
	// every slot is taken, as many as any other address; it was closed
	// at once.
	ErrAddressBusy = errors.New("too many unfinished handshakes from this address")
	// ErrHandshakeEvicted: every handshake slot was taken and this
	// connection's handshake was the one given up to make room for a
	// newer connection (the oldest, older than Config.EvictAfter, from
	// the address holding the most slots).
	ErrHandshakeEvicted = errors.New("unfinished handshake closed to make room for a new connection")
)

// admission decides which inbound connections may run their handshake.
// Before a connection has finished TLS and HELLO nothing is known about
// it, so anyone who can reach the port could otherwise hold every slot
// with connections that never send a byte, each until the handshake
// timeout, and keep every configured peer out (issue 20 measured 0 of 20
// segments delivered in 30 s under 300 such connections). Three rules:
//
//   - at most max connections are admitted at once (handshaking, or
//     authenticated and waiting for Accept);
//   - at most perAddr of them may be unfinished handshakes from one
//     source address (an IPv4 address, an IPv6 /64: what one host
//     controls); a further one is closed at once, which costs a flood
//     from that address an accept and a close;
//   - when all max are taken, a newcomer from an address that already
//     holds as many unfinished handshakes as any other is closed at once
//     (it would be its own address's turn to lose one); for any other
//     newcomer the unfinished handshake that has run longest, from the
//     address holding the most, is closed, provided it has run at least
//     evictAfter; otherwise the newcomer waits (at most evictAfter) and
//     no further connection is accepted meanwhile (the kernel's backlog
//     holds them, as it did before).
//
// A flood from a few addresses is thus shed as fast as it is accepted,
// so the backlog ahead of a real peer's connection drains at once, and
// the peer (holding fewer slots than the flood's addresses) gets one
// within evictAfter. A real handshake takes a few round trips, well under
// evictAfter, so a burst of genuine connections beyond max is mostly
// delayed rather than cut (no thrashing under load); only a host already
// holding the most loses its newest dials then. What this cannot stop is a
// flood from more addresses than there are slots: each of its
// connections then waits its turn like a peer's.
type admission struct {
	max, perAddr int
	evictAfter   time.Duration

	mu     sync.Mutex
	live   map[*pending]struct{} // admitted and not yet released or evicted
	byAddr map[string]int        // unfinished handshakes per address key
	freed  chan struct{}         // signalled (non-blocking) when a slot frees
}

// pending is one admitted connection.
type pending struct {
	conn    net.Conn
	addr    string
	started time.Time
	authed  bool // finished its handshake: waits for Accept, never evicted
	gone    bool // released or evicted: counts no more
}

func newAdmission(max, perAddr int, evictAfter time.Duration) *admission {
	return &admission{max: max, perAddr: perAddr, evictAfter: evictAfter,
		live: map[*pending]struct{}{}, byAddr: map[string]int{}, freed: make(chan struct{}, 1)}
}

// admit registers c. It returns the pending entry and a victim to close
// (or nil), or ErrAddressBusy, or wait > 0: no slot now and none may be
// taken yet; call again after a slot frees (a.freed) or wait elapses.
func (a *admission) admit(c net.Conn, now time.Time) (p, victim *pending, wait time.Duration, err error) {
	key := addrKey(c.RemoteAddr())
	a.mu.Lock()
	defer a.mu.Unlock()
	held := a.byAddr[key]
	if held >= a.perAddr {
		return nil, nil, 0, ErrAddressBusy
	}
	if len(a.live) >= a.max {
		if held > 0 && held >= a.topLocked() {
			// It would be its own address's turn to give one up.
			return nil, nil, 0, ErrAddressBusy
		}
		victim, wait = a.victimLocked(now)
		if victim == nil {
			return nil, nil, wait, nil
		}
		a.dropLocked(victim)
	}
	p = &pending{conn: c, addr: key, started: now}
	a.live[p] = struct{}{}
	a.byAddr[key]++
	return p, victim, 0, nil
}

// topLocked is the most unfinished handshakes any one address holds.
func (a *admission) topLocked() int {
	top := 0
	for _, n := range a.byAddr {
		top = max(top, n)
	}
	return top
}

// victimLocked picks the handshake to give up for a newcomer, or says how
// long until one may be given up (a.evictAfter when every slot holds an
// authenticated connection waiting for Accept: one will free soon).
func (a *admission) victimLocked(now time.Time) (*pending, time.Duration) {
	var best *pending
	wait := a.evictAfter
	for p := range a.live {
		if p.authed {
			continue
		}
		if age := now.Sub(p.started); age < a.evictAfter {
			wait = min(wait, a.evictAfter-age)
			continue
		}
		if best == nil || a.byAddr[p.addr] > a.byAddr[best.addr] ||
			a.byAddr[p.addr] == a.byAddr[best.addr] && p.started.Before(best.started) {
			best = p
		}
	}
	return best, max(wait, time.Millisecond)
}

func (a *admission) dropLocked(p *pending) {
	if p.gone {
		return
	}
	p.gone = true
	delete(a.live, p)
	if !p.authed {
		if a.byAddr[p.addr]--; a.byAddr[p.addr] <= 0 {
			delete(a.byAddr, p.addr)
		}
	}
	select {
	case a.freed <- struct{}{}:
	default:
	}
}

// authenticated marks p's handshake finished: it no longer counts
// against its address and cannot be evicted. It reports false if p was
// evicted meanwhile (its connection is closed; drop it).
func (a *admission) authenticated(p *pending) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.gone {
		return false
	}
	p.authed = true
	if a.byAddr[p.addr]--; a.byAddr[p.addr] <= 0 {
		delete(a.byAddr, p.addr)
	}
	return true
}

// evicted reports whether p was closed to make room (before release).
func (a *admission) evicted(p *pending) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return p.gone
}

// release frees p's slot (idempotent; a no-op after eviction).
func (a *admission) release(p *pending) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropLocked(p)
}

// counts: see Listener.Pending.
func (a *admission) counts() (admitted, handshaking int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for p := range a.live {
		if !p.authed {
			handshaking++
		}
	}
	return len(a.live), handshaking
}

// addrKey groups remote addresses by what one host controls: an IPv4
// address, or an IPv6 address's /64 (one host, or one customer's network,
// is commonly given a whole /64). Other address kinds count by their
// string.
func addrKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		if a == nil {
			return ""
		}
		return a.String()
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// shed closes a connection the listener gives up before its handshake
// finished with a reset rather than a FIN: nothing was said on it, and a
// flood of them must not leave this side with a TIME_WAIT socket each.
func shed(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}
