// Package transport authenticates edge agent connections: mutual TLS 1.3
// with node identities from certificates (package pki), then one HELLO
// each way (package wire). What it hands out is a *wire.Conn whose peer is
// known and allowed.
//
// Rules (docs/wire.md):
//   - TLS 1.3 only, both directions present certificates, both verify them
//     against the configured CA pool (the current one: files reload without
//     restart, see Reloader).
//   - A peer's identity is its certificate's node id (pki.NodeID). Host
//     names and addresses are never checked: devices move.
//   - Inbound, only node ids for which Config.AllowPeer is true complete the
//     handshake. Outbound, Dial refuses a peer id AllowPeer rejects and a
//     server whose certificate names any node other than the one dialled.
//   - The HELLO's node id must equal the certificate's.
//   - Inbound connections that have not finished TLS and HELLO are
//     admitted so that unauthenticated ones cannot keep configured peers
//     out: a cap per source address, and the address holding the most
//     gives up a slot when all are taken (admission, in admit.go).
package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/wire"
)

// Sentinel errors.
var (
	// ErrPeerNotAllowed: the peer's node id is not configured (AllowPeer
	// returned false).
	ErrPeerNotAllowed = errors.New("peer not allowed")
	// ErrIdentityMismatch: a certificate or HELLO names another node than
	// expected (the dialled peer, the certificate's node, or this node).
	ErrIdentityMismatch = errors.New("node identity mismatch")
)

// Config configures a Transport.
type Config struct {
	// NodeID is this node's id; its certificate must name it.
	NodeID string
	// CertFile and KeyFile are this node's PEM certificate (leaf first,
	// optionally followed by intermediates) and PKCS#8/EC/RSA key. The same
	// certificate serves as TLS server and client certificate.
	CertFile, KeyFile string
	// CAFile holds the PEM CA certificates peers must chain to. Several may
	// be listed, e.g. old and new during a CA rotation.
	CAFile string
	// AllowPeer reports whether a node id is a configured peer. Required.
	// It is called during handshakes from several goroutines.
	AllowPeer func(id string) bool
	// HandshakeTimeout bounds TLS handshake plus HELLO exchange, inbound
	// and outbound. Default 10s.
	HandshakeTimeout time.Duration
	// MaxPendingHandshakes bounds inbound connections being authenticated
	// or waiting for Accept. When all are taken, the oldest unfinished
	// handshake that has run at least EvictAfter, from the address holding
	// the most, is closed for the next connection; if none has, that
	// connection waits (and further ones in the kernel's backlog). Default
	// 64.
	MaxPendingHandshakes int
	// MaxPendingPerAddress bounds the unfinished inbound handshakes from
	// one source address (IPv4 address, IPv6 /64); a further connection
	// from it is closed at once, as is one from an address holding as many
	// as any other while all MaxPendingHandshakes are taken.
	// Unauthenticated connections from one host cannot take more than this
	// from other hosts. Default 16.
	MaxPendingPerAddress int
	// EvictAfter is how long an inbound handshake runs before it may be
	// given up for a newer connection when every slot is taken; a real
	// peer's handshake (a few round trips) finishes well within it.
	// Default HandshakeTimeout / 5 (2 s for 10 s).
	EvictAfter time.Duration
	// Wire configures every wire.Conn handed out. Wire.Version is the
	// highest protocol version to negotiate (zero: wire.Version; 1 turns
	// negotiation off, as in agents that predate it); each connection
	// then runs the version both ends speak (docs/wire.md).
	Wire wire.Options
	// OnReloadError, if set, is told when changed certificate files could
	// not be loaded (the old ones stay in use). Called once per change.
	OnReloadError func(error)
	// OnReload, if set, is told of each certificate put in use after the
	// one New loaded: picked up at a handshake after the files changed,
	// or by Reload. Called once per change, with the lock that orders
	// reloads held: it must not call back into the Transport.
	OnReload func(leaf *x509.Certificate)
	// WrapConn, if set, wraps every outbound TCP connection before TLS
	// runs over it, with the id of the peer dialled: edge/bandwidth limits
	// what is sent to each peer this way, below the protocol.
	WrapConn func(peerID string, c net.Conn) net.Conn
	// OnReject, if set, is told why an inbound connection was refused
	// (handshake failure, unknown peer, HELLO mismatch, timeout). Accept
	// never returns these: one bad client must not stop a listener.
	OnReject func(remote net.Addr, err error)
}

// Transport dials and listens with one node's credentials.
type Transport struct {
	cfg Config
	rl  *Reloader
}

// New checks cfg and loads the certificate files.
func New(cfg Config) (*Transport, error) {
	if err := wire.CheckNodeID(cfg.NodeID); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	if cfg.AllowPeer == nil {
		return nil, errors.New("transport: AllowPeer is required (only configured peers may connect)")
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.MaxPendingHandshakes <= 0 {
		cfg.MaxPendingHandshakes = 64
	}
	if cfg.MaxPendingPerAddress <= 0 {
		cfg.MaxPendingPerAddress = 16
	}
	if cfg.EvictAfter <= 0 {
		cfg.EvictAfter = cfg.HandshakeTimeout / 5
	}
	rl, err := newReloader(cfg.NodeID, cfg.CertFile, cfg.KeyFile, cfg.CAFile, cfg.OnReloadError, cfg.OnReload)
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	return &Transport{cfg: cfg, rl: rl}, nil
}

// Reload re-reads the certificate files now (call it on SIGHUP). On error
// the previous credentials stay in use. Connections already established
// are not affected either way.
func (t *Transport) Reload() error { return t.rl.Reload() }

// Material returns the credentials the next handshake will use.
func (t *Transport) Material() *Material { return t.rl.Current() }

// peerID extracts and checks the node id of a verified peer chain.
func (t *Transport) peerID(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("peer sent no certificate")
	}
	id, err := pki.NodeID(cs.PeerCertificates[0])
	if err != nil {
		return "", err
	}
	if !t.cfg.AllowPeer(id) {
		return "", fmt.Errorf("%w: %q", ErrPeerNotAllowed, id)
	}
	return id, nil
}

func tls13(c *tls.Config) *tls.Config {
	c.MinVersion, c.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	return c
}

// serverConfig picks up the current material at each ClientHello, so
// rotated files apply to the next handshake; the standard library then
// verifies the client chain against that material's pool.
func (t *Transport) serverConfig() *tls.Config {
	return tls13(&tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := t.rl.Current()
			return tls13(&tls.Config{
				NextProtos:   t.protocols(),
				Certificates: []tls.Certificate{m.Cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.Pool,
				VerifyConnection: func(cs tls.ConnectionState) error {
					_, err := t.peerID(cs)
					return err
				},
			}), nil
		},
	})
}

// protocols are the ALPN names of the versions this side offers.
func (t *Transport) protocols() []string {
	max := t.cfg.Wire.Version
	if max <= 0 {
		max = wire.Version
	}
	return wire.ALPNProtocols(max)
}

// clientConfig verifies the server against the current pool itself:
// the standard verifier would also demand a DNS SAN matching the server
// name, which certificates issued before node ids became DNS SANs lack,
// and which is not how edge nodes are identified (the identity URI is).
// The server name sent is the peer's node id (pki.ServerName), the rule
// docs/wire.md gives third-party clients; servers do not check it.
func (t *Transport) clientConfig(peerID string) *tls.Config {
	m := t.rl.Current()
	return tls13(&tls.Config{
		ServerName:         pki.ServerName(peerID),
		NextProtos:         t.protocols(),
		Certificates:       []tls.Certificate{m.Cert},
		InsecureSkipVerify: true, // replaced by VerifyConnection below, never skipped
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: m.Pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				return fmt.Errorf("verify server certificate: %w", err)
			}
			id, err := t.peerID(cs)
			if err != nil {
				return err
			}
			if id != peerID {
				return fmt.Errorf("%w: dialled %q, server certificate names %q", ErrIdentityMismatch, peerID, id)
			}
			return nil
		},
	})
}

// Dial connects to peerID at addr, authenticates both ways and exchanges
// HELLO. ctx bounds the whole setup, as does Config.HandshakeTimeout. The
// returned Conn's later operations use their own contexts.
func (t *Transport) Dial(ctx context.Context, addr, peerID string) (*wire.Conn, error) {
	if !t.cfg.AllowPeer(peerID) {
		return nil, fmt.Errorf("dial %s at %s: %w", peerID, addr, ErrPeerNotAllowed)
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s at %s: %w", peerID, addr, err)
	}
	if t.cfg.WrapConn != nil {
		raw = t.cfg.WrapConn(peerID, raw)
	}
	tc := tls.Client(newBatchConn(raw), t.clientConfig(peerID))
	wc, _, err := t.handshake(ctx, tc, peerID)
	if err != nil {
		tc.Close()
		return nil, fmt.Errorf("dial %s at %s: %w", peerID, addr, err)
	}
	return wc, nil
}

// handshake completes TLS and HELLO on either side. wantPeer is the
// dialled id (client side) or "" (server side: whoever the certificate
// names, once allowed).
func (t *Transport) handshake(ctx context.Context, tc *tls.Conn, wantPeer string) (*wire.Conn, string, error) {
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, "", fmt.Errorf("tls handshake: %w", err)
	}
	certID, err := t.peerID(tc.ConnectionState())
	if err != nil {
		return nil, "", err // unreachable after VerifyConnection; kept as a guard
	}
	opt := t.cfg.Wire
	if opt.Version, err = wire.NegotiatedVersion(tc.ConnectionState().NegotiatedProtocol); err != nil {
		return nil, "", err
	}
	wc := wire.NewConn(tc, opt)
	// Both sides send first: HELLO is small, so neither write can block on
	// the other's read. In TLS 1.3 a client learns that the server refused
	// its certificate only here, when RecvHello reads the alert.
	if err := wc.SendHello(ctx, t.cfg.NodeID); err != nil {
		return nil, "", err
	}
	h, err := wc.RecvHello(ctx)
	if err != nil {
		return nil, "", err
	}
	if h.NodeID != certID {
		return nil, "", fmt.Errorf("%w: HELLO says %q, certificate says %q", ErrIdentityMismatch, h.NodeID, certID)
	}
	if wantPeer != "" && certID != wantPeer {
		return nil, "", fmt.Errorf("%w: dialled %q, got %q", ErrIdentityMismatch, wantPeer, certID)
	}
	return wc, certID, nil
}

// Listener accepts authenticated connections. Handshakes run concurrently
// in the background (at most Config.MaxPendingHandshakes, and
// Config.MaxPendingPerAddress per source address: see admission), so a
// slow or hostile client, or a flood of connections that never send a
// byte, cannot hold up others.
type Listener struct {
	t      *Transport
	ln     net.Listener
	tlsCfg *tls.Config
	ready  chan accepted
	adm    *admission
	ctx    context.Context // canceled by Close: aborts handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

type accepted struct {
	conn *wire.Conn
	peer string
}

// Listen starts accepting on addr (e.g. "0.0.0.0:7443", "127.0.0.1:0").
func (t *Transport) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return t.Serve(ln), nil
}

// Serve is Listen on an existing listener, which the Listener then owns.
func (t *Transport) Serve(ln net.Listener) *Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{t: t, ln: ln, tlsCfg: t.serverConfig(), ready: make(chan accepted), ctx: ctx, cancel: cancel,
		adm: newAdmission(t.cfg.MaxPendingHandshakes, t.cfg.MaxPendingPerAddress, t.cfg.EvictAfter)}
	l.wg.Add(1)
	go l.loop()
	return l
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Accept waits for the next authenticated connection and returns it with
// the peer's node id. After Close it returns net.ErrClosed.
func (l *Listener) Accept() (*wire.Conn, string, error) {
	select {
	case a := <-l.ready:
		return a.conn, a.peer, nil
	case <-l.ctx.Done():
		return nil, "", fmt.Errorf("accept: %w", net.ErrClosed)
	}
}

// Close stops listening, aborts handshakes in progress, closes
// authenticated connections nobody accepted yet, and waits for its
// goroutines. Connections already returned by Accept are the caller's.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.ln.Close()
		l.wg.Wait()
	})
	return err
}

func (l *Listener) loop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures such as EMFILE: back off as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.reject(nil, fmt.Errorf("accept: %w", err))
			select {
			case <-time.After(backoff):
			case <-l.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		p, ok := l.admit(raw)
		if !ok {
			return
		}
		if p == nil {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer l.adm.release(p)
			l.serveConn(raw, p)
		}()
	}
}

// admit waits until raw may run its handshake (see admission) and returns
// its entry, or nil when raw was shed; ok is false when the listener is
// closing (raw is closed then).
func (l *Listener) admit(raw net.Conn) (p *pending, ok bool) {
	for {
		p, victim, wait, err := l.adm.admit(raw, time.Now())
		if err != nil {
			shed(raw)
			l.reject(raw.RemoteAddr(), err)
			return nil, true
		}
		if victim != nil {
			shed(victim.conn)
			l.reject(victim.conn.RemoteAddr(), ErrHandshakeEvicted)
		}
		if p != nil {
			return p, true
		}
		t := time.NewTimer(wait)
		select {
		case <-l.adm.freed:
		case <-t.C:
		case <-l.ctx.Done():
			t.Stop()
			raw.Close()
			return nil, false
		}
		t.Stop()
	}
}

// Pending reports how many inbound connections are admitted now
// (handshaking, or authenticated and waiting for Accept) and how many of
// them are handshakes still unfinished.
func (l *Listener) Pending() (admitted, handshaking int) { return l.adm.counts() }

func (l *Listener) serveConn(raw net.Conn, p *pending) {
	ctx, cancel := context.WithTimeout(l.ctx, l.t.cfg.HandshakeTimeout)
	defer cancel()
	tc := tls.Server(newBatchConn(raw), l.tlsCfg)
	wc, peer, err := l.t.handshake(ctx, tc, "")
	if err != nil {
		tc.Close()
		if !l.adm.evicted(p) { // an evicted one was reported when it was shed
			l.reject(raw.RemoteAddr(), err)
		}
		return
	}
	if !l.adm.authenticated(p) {
		tc.Close() // evicted as it finished; reported already
		return
	}
	select {
	case l.ready <- accepted{wc, peer}:
	case <-l.ctx.Done():
		wc.Close()
	}
}

func (l *Listener) reject(addr net.Addr, err error) {
	if l.t.cfg.OnReject != nil {
		l.t.cfg.OnReject(addr, err)
	}
}
