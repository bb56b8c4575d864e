package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// v2Peer is a scripted version 2 receiver: it declines held segments with
// an ACK, accepts the others, reads and checks their bytes, and holds its
// ACKs until the window is full (or the test's total is reached), then
// sends them newest first (a declined offer counts toward the window). A sender that did not pipeline would wait
// forever for the first ACK, so the tests fail rather than pass slowly.
// With dropAfter > 0 the first connection is cut after that many
// segments arrived, none of them acknowledged (a crash with a full
// window in flight).
type v2Peer struct {
	ln     *transport.Listener
	window int
	total  int // segments the test sends; the last partial window is acked at it

	mu        sync.Mutex
	held      map[string]bool
	received  []string // SEGMENTs read, in order
	acked     map[string]bool
	dropAfter int
	conns     int
	// holdFirst: acknowledge every segment at once except the first one
	// received, which is acknowledged only when total have arrived.
	holdFirst bool
	// claims: answers to QUERY: segment id → the digest the peer names
	// for it in HOLDS (another digest than the sender's is a segment it
	// holds under the same id with other content).
	claims           map[string]string
	queries, offered int
	// store, when set, is the peer's real segment store: QUERY and OFFER
	// are answered from it as edged does (held = same id, size and
	// digest), an offer of an id it holds with other content is refused,
	// and every segment received is acknowledged at once.
	store      *segstore.Store
	querySizes []int
	offeredIDs []string
	pushedIDs  []string // segments that came in a PUSH
	// full: every offer is refused for want of room (NACK quota).
	full bool
}

func newV2Peer(t testing.TB, dir string, window, total int) *v2Peer {
	t.Helper()
	tr, err := transport.New(transport.Config{
		NodeID: "b", CertFile: filepath.Join(dir, "b.crt"), KeyFile: filepath.Join(dir, "b.key"),
		CAFile: filepath.Join(dir, pki.CACertFile), AllowPeer: func(p string) bool { return p == "a" },
		Wire: wire.Options{IdleTimeout: time.Minute, Window: window},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &v2Peer{ln: ln, window: window, total: total, held: map[string]bool{}, acked: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, _, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				defer c.Close()
				p.serve(ctx, t, c)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return p
}

func (p *v2Peer) serve(ctx context.Context, t testing.TB, c *wire.Conn) {
	if c.Version() < wire.Version2 {
		t.Errorf("peer connection runs version %d", c.Version())
		return
	}
	p.mu.Lock()
	p.conns++
	drop := p.conns == 1 && p.dropAfter > 0
	p.mu.Unlock()
	var pending []string  // received, not acknowledged
	got, declined := 0, 0 // declined since the last flush
	for {
		req, err := c.RecvRequest(ctx)
		if err != nil {
			return
		}
		if req.Query != nil {
			var held []wire.Offer
			p.mu.Lock()
			p.queries++
			p.querySizes = append(p.querySizes, len(req.Query))
			for _, o := range req.Query {
				if p.store != nil {
					if e, err := p.store.Stat(o.SegmentID); err == nil && e.Size == o.Size && e.SHA256 == o.SHA256 {
						held = append(held, o)
					}
					continue
				}
				if d, ok := p.claims[o.SegmentID]; ok {
					o.SHA256 = d
					held = append(held, o)
				}
			}
			p.mu.Unlock()
			if c.SendHolds(ctx, held) != nil {
				return
			}
			continue
		}
		o := req.Offer
		if !req.Segment {
			p.mu.Lock()
			p.offered++
			p.offeredIDs = append(p.offeredIDs, o.SegmentID)
			held := p.held[o.SegmentID]
			full := p.full
			var other bool
			if p.store != nil {
				e, err := p.store.Stat(o.SegmentID)
				held = err == nil && e.Size == o.Size && e.SHA256 == o.SHA256
				other = err == nil && !held
			}
			p.mu.Unlock()
			if full {
				err = c.SendNack(ctx, wire.Nack{SegmentID: o.SegmentID, Code: wire.NackQuota, Message: "scripted: full"})
			} else if other {
				err = c.SendNack(ctx, wire.Nack{SegmentID: o.SegmentID, Code: wire.NackBadRequest, Message: "held with a different digest"})
			} else if held {
				err = c.SendAck(ctx, o.SegmentID)
				declined++
				p.mu.Lock()
				p.acked[o.SegmentID] = true
				p.mu.Unlock()
			} else {
				err = c.SendAccept(ctx, o)
			}
			if err != nil {
				return
			}
			continue
		}
		h := sha256.New()
		if err := c.RecvPayload(ctx, o, func(r io.Reader) error { _, err := io.Copy(h, r); return err }); err != nil {
			return
		}
		if req.Pushed {
			p.mu.Lock()
			p.pushedIDs = append(p.pushedIDs, o.SegmentID)
			p.mu.Unlock()
		}
		if hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
			t.Errorf("%s: digest differs", o.SegmentID)
			return
		}
		got++
		p.mu.Lock()
		p.received = append(p.received, o.SegmentID)
		done := len(p.acked) + len(pending) + 1
		p.mu.Unlock()
		pending = append(pending, o.SegmentID)
		if p.store != nil {
			if c.SendAck(ctx, o.SegmentID) != nil {
				return
			}
			pending = nil
			continue
		}
		if p.holdFirst {
			ids := pending[len(pending)-1:]
			if got == 1 {
				ids = nil // held
			}
			if got == p.total {
				ids = []string{pending[0], o.SegmentID}
			}
			for _, id := range ids {
				if c.SendAck(ctx, id) != nil {
					return
				}
				p.mu.Lock()
				p.acked[id] = true
				p.mu.Unlock()
			}
			continue
		}
		if drop && got == p.dropAfter {
			return // cut with the window in flight, nothing acknowledged
		}
		if len(pending)+declined < p.window && done < p.total {
			continue
		}
		declined = 0
		for _, id := range slices.Backward(pending) {
			if c.SendAck(ctx, id) != nil {
				return
			}
			p.mu.Lock()
			p.acked[id] = true
			p.mu.Unlock()
		}
		pending = nil
	}
}

func (p *v2Peer) receivedCopy() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.received)
}

// windowFixture: sender a with one worker and peer b as a v2Peer.
func windowFixture(t *testing.T, window, total int) (*node, *v2Peer, *Executor) {
	t.Helper()
	dir := pkitest.New(t, "a", "b")
	a := newNode(t)
	b := newV2Peer(t, dir, window, total)
	tr, err := transport.New(transport.Config{
		NodeID: "a", CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key"),
		CAFile: filepath.Join(dir, pki.CACertFile), AllowPeer: func(p string) bool { return p == "b" },
		Wire: wire.Options{IdleTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := New(Config{
		Peers: map[string]string{"b": b.ln.Addr().String()}, Condition: ledger.AllPeers,
		Policy: testPolicy(5), Workers: 1, AckTimeout: 10 * time.Second, Log: quietLog(t),
	}, a.led, a.store, tr)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ex
}

// TestPipelinedDelivery: one worker delivers 3 windows of segments over
// one version 2 connection (the peer answers only full windows), a held
// segment is declined before its bytes are sent and still Acked, every
// record takes one attempt, and every segment is marked relayed.
func TestPipelinedDelivery(t *testing.T) {
	const window, n = 4, 12
	a, b, ex := windowFixture(t, window, n)
	b.held["seg-05"] = true
	var ids []string
	for i := range n {
		id := fmt.Sprintf("seg-%02d", i)
		ids = append(ids, id)
		if err := ex.Schedule(a.put(t, id, []byte("content of "+id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for _, id := range ids {
		r := a.waitRecord(t, id, "b", inState(ledger.StateAcked))
		if r.Attempts != 1 {
			t.Errorf("%s took %d attempts", id, r.Attempts)
		}
		waitRelayed(t, a, id)
	}
	got := b.receivedCopy()
	if slices.Contains(got, "seg-05") || len(got) != n-1 {
		t.Fatalf("peer received %v; want every segment but the held seg-05", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns != 1 {
		t.Fatalf("%d connections, want 1", b.conns)
	}
}

// TestPipelinedCutWithWindowInFlight: the receiver reads a full window of
// segments and the connection is cut before any ACK (as kill -9 of the
// receiver would). None of them is Acked on that attempt: each record
// fails once and is Acked on the next connection, and no record is Acked
// that the peer did not acknowledge.
func TestPipelinedCutWithWindowInFlight(t *testing.T) {
	const window, n = 4, 4
	a, b, ex := windowFixture(t, window, n)
	b.dropAfter = window
	for i := range n {
		id := fmt.Sprintf("seg-%02d", i)
		if err := ex.Schedule(a.put(t, id, []byte("content of "+id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for i := range n {
		id := fmt.Sprintf("seg-%02d", i)
		r := a.waitRecord(t, id, "b", inState(ledger.StateAcked))
		if r.Attempts != 2 {
			t.Errorf("%s Acked after %d attempts, want 2 (the cut window failed)", id, r.Attempts)
		}
		b.mu.Lock()
		acked := b.acked[id]
		b.mu.Unlock()
		if !acked {
			t.Errorf("%s Acked but the peer never acknowledged it", id)
		}
	}
}

// TestPushFirstAttemptOnly: with relay.push_max_bytes set, a record's
// first attempt of a segment up to that size is a PUSH and a larger one
// an OFFER; after the connection is cut with the window in flight (the
// peer may hold what it received, its ACKs lost), every retry is an
// OFFER, which a peer holding the segment declines without its bytes.
func TestPushFirstAttemptOnly(t *testing.T) {
	const window, n = 4, 4
	a, b, ex := windowFixture(t, window, n)
	ex.cfg.PushMaxBytes = 100
	b.dropAfter = window
	var ids []string
	for i := range n {
		id := fmt.Sprintf("seg-%02d", i)
		ids = append(ids, id)
		content := []byte("content of " + id)
		if i == 2 {
			content = []byte(strings.Repeat("x", 101)) // above push_max_bytes
		}
		if err := ex.Schedule(a.put(t, id, content)); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for _, id := range ids {
		if r := a.waitRecord(t, id, "b", inState(ledger.StateAcked)); r.Attempts != 2 {
			t.Errorf("%s Acked after %d attempts, want 2 (the cut window failed)", id, r.Attempts)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	slices.Sort(b.pushedIDs)
	if want := []string{"seg-00", "seg-01", "seg-03"}; !slices.Equal(b.pushedIDs, want) {
		t.Errorf("pushed %v, want the first attempts of the small segments %v", b.pushedIDs, want)
	}
	slices.Sort(b.offeredIDs)
	if want := []string{"seg-00", "seg-01", "seg-02", "seg-02", "seg-03"}; !slices.Equal(b.offeredIDs, want) {
		t.Errorf("offered %v, want the large segment twice and every retry %v", b.offeredIDs, want)
	}
}

// TestPipelinedWindowRefills: the window is refilled as single slots free
// up, not only once a whole window is answered. The peer holds the first
// segment's ACK until every segment has arrived, which a sender that waits
// for all of a window's replies before offering more would never reach.
func TestPipelinedWindowRefills(t *testing.T) {
	const window, n = 4, 16
	a, b, ex := windowFixture(t, window, n)
	b.holdFirst = true
	for i := range n {
		id := fmt.Sprintf("seg-%02d", i)
		if err := ex.Schedule(a.put(t, id, []byte("content of "+id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for i := range n {
		r := a.waitRecord(t, fmt.Sprintf("seg-%02d", i), "b", inState(ledger.StateAcked))
		if r.Attempts != 1 {
			t.Errorf("%s took %d attempts", r.SegmentID, r.Attempts)
		}
	}
}

// TestResyncSummary: after an offline period a sender owes 1,000 segments
// to a peer that already holds 980 of them. One QUERY/HOLDS exchange
// settles those: they are Acked without an OFFER each. The peer names one
// more segment under its id but with another digest: that one does not
// count as held, it is offered and sent like the 19 the peer lacks
// (n-held = 20 segments move, 20 offers: the first record, claimed before
// the query, is asked about in it too).
func TestResyncSummary(t *testing.T) {
	const n, held = 1000, 980
	a, b, ex := windowFixture(t, 64, n-held)
	b.claims = map[string]string{}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("seg-%04d", i)
		ids = append(ids, id)
		e := a.put(t, id, []byte("content of "+id))
		if err := ex.Schedule(e); err != nil {
			t.Fatal(err)
		}
		switch {
		case i < held:
			b.claims[id] = e.SHA256
		case i == held:
			b.claims[id] = strings.Repeat("0", 64) // same id, other content
		}
	}
	run(t, ex)
	for _, id := range ids {
		a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t.Logf("%d segments owed, %d held by the peer: %d QUERY, %d OFFER frames", n, held, b.queries, b.offered)
	if b.queries != 1 {
		t.Errorf("%d QUERY frames, want 1", b.queries)
	}
	if b.offered != n-held {
		t.Errorf("%d OFFER frames, want %d (the missing ones and the one held with another digest)", b.offered, n-held)
	}
	if !slices.Contains(b.received, fmt.Sprintf("seg-%04d", held)) {
		t.Errorf("the segment the peer holds with another digest was not sent")
	}
}
