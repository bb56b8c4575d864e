package relay

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// frozenClock is a ledger clock the test moves by hand.
type frozenClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *frozenClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *frozenClock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

// fullPolicy: two retries only, so that charging refusals would
// deadletter within the test's rounds.
var fullPolicy = ledger.Policy{MaxRetries: 2, Initial: time.Minute, Max: 4 * time.Minute}

// quiet waits until nothing is due or in flight at the frozen now.
func quiet(t *testing.T, n *node, clock *frozenClock, what string, more func() bool) {
	t.Helper()
	waitCond(t, what, func() bool {
		due, err := n.led.Pending(clock.Now(), 0)
		infl, ierr := n.led.ListByState(ledger.StateInflight)
		return err == nil && ierr == nil && len(due) == 0 && len(infl) == 0 && more()
	})
}

// budgetKept checks that no record is deadlettered and none has spent any
// of its retry budget.
func budgetKept(t *testing.T, n *node, ids []string) {
	t.Helper()
	for _, id := range ids {
		r, err := n.led.Get(id, "b")
		if err != nil {
			t.Fatal(err)
		}
		if r.State == ledger.StateDeadletter || r.BudgetUsed() != 0 {
			t.Errorf("%s after refusals for room: %s, %d of its budget used (%d attempts): %s", id, r.State, r.BudgetUsed(), r.Attempts, r.LastError)
		}
	}
}

// TestFullPeerAskedOncePerRound: a peer that refuses every offer for want
// of room (NACK quota) is offered one segment per round of the room
// circuit, rounds growing with the back-off; no refusal spends a retry
// budget, so after three times max_retries rounds nothing is
// deadlettered; when the peer has room again, its probe's ACK makes the
// whole backlog due and it is delivered. The clock is frozen and moved by
// hand, so the counts are exact.
func TestFullPeerAskedOncePerRound(t *testing.T) {
	const segments, rounds = 20, 3 * 2
	f := newFixture(t, nack(wire.NackQuota), ack)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &frozenClock{now: t0}
	ex, err := New(Config{
		Peers: map[string]string{"b": f.b.addr()}, Condition: ledger.AllPeers, Policy: fullPolicy,
		Workers: 1, DialTimeout: 2 * time.Second, AckTimeout: 5 * time.Second, Now: clock.Now, Log: quietLog(t),
	}, f.a.led, f.a.store, newTransport(t, f.pkiDir, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range segments {
		id := fmt.Sprintf("s-%02d", i)
		ids = append(ids, id)
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	at := t0
	for round := 1; round <= rounds; round++ {
		if round > 1 {
			clock.set(at)
			ex.Kick()
		}
		reopen := at.Add(fullPolicy.Backoff(round))
		quiet(t, f.a, clock, fmt.Sprintf("round %d: %d offers, room circuit open until %v", round, round, reopen.Sub(t0)), func() bool {
			return len(f.b.received()) == round && ex.full.state("b", clock.Now()).ReopenAt.Equal(reopen)
		})
		at = reopen
	}
	budgetKept(t, f.a, ids)
	if c := ex.Circuits()[0]; c.Room != CircuitOpen || c.RoomRefusals != rounds || !c.RoomReopenAt.Equal(at) || c.State != CircuitClosed {
		t.Errorf("circuits of the full peer: %+v; want room open after %d rounds until %v, dial circuit closed", c, rounds, at.Sub(t0))
	}
	if r, _ := f.a.led.Get("s-00", "b"); r.Attempts != rounds {
		t.Errorf("the probe s-00 made %d attempts in %d rounds", r.Attempts, rounds)
	}
	if r, _ := f.a.led.Get("s-01", "b"); r.Attempts != 0 {
		t.Errorf("s-01 was offered %d times while the peer was full; want 0 (deferred)", r.Attempts)
	}

	f.b.setScript(ack) // room again
	clock.set(at)
	ex.Kick()
	for _, id := range ids {
		f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	if c := ex.Circuits()[0]; c.Room != CircuitClosed || c.RoomRefusals != 0 {
		t.Errorf("room circuit %s with %d refusals after the peer acknowledged", c.Room, c.RoomRefusals)
	}
	if got := len(f.b.received()); got != rounds+segments {
		t.Fatalf("%d offers in all, want %d (one per full round, then each segment once)", got, rounds+segments)
	}
}

// TestFullPeerStopsStream: on a version 2 connection a window of offers
// is in flight when the first refusal for room arrives; the stream claims
// nothing more, every refused record is postponed with its budget intact,
// and each later round is one offer, however many rounds the peer stays
// full.
func TestFullPeerStopsStream(t *testing.T) {
	const window, segments, rounds = 8, 200, 5
	dir := pkitest.New(t, "a", "b")
	a := newNode(t)
	b := newV2Peer(t, dir, window, segments)
	b.full = true
	tr, err := transport.New(transport.Config{
		NodeID: "a", CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key"),
		CAFile: filepath.Join(dir, pki.CACertFile), AllowPeer: func(p string) bool { return p == "b" },
		Wire: wire.Options{IdleTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &frozenClock{now: t0}
	ex, err := New(Config{
		Peers: map[string]string{"b": b.ln.Addr().String()}, Condition: ledger.AllPeers, Policy: fullPolicy,
		Workers: 1, DialTimeout: 2 * time.Second, AckTimeout: 5 * time.Second, Now: clock.Now, Log: quietLog(t),
	}, a.led, a.store, tr)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range segments {
		id := fmt.Sprintf("s-%03d", i)
		ids = append(ids, id)
		if err := ex.Schedule(a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	offered := func() int { b.mu.Lock(); defer b.mu.Unlock(); return b.offered }
	run(t, ex)
	// First round: what the stream had offered or claimed before the
	// refusal arrived, at most a window and one claim chunk.
	reopen := t0.Add(fullPolicy.Backoff(1))
	quiet(t, a, clock, "first round refused", func() bool {
		return offered() > 0 && ex.full.state("b", clock.Now()).ReopenAt.Equal(reopen)
	})
	first := offered()
	if first > window+window/4 {
		t.Fatalf("%d offers before the stream stopped, want at most a window and a chunk (%d)", first, window+window/4)
	}
	at := reopen
	for round := 2; round <= rounds; round++ {
		clock.set(at)
		ex.Kick()
		reopen = at.Add(fullPolicy.Backoff(round))
		quiet(t, a, clock, fmt.Sprintf("round %d refused", round), func() bool {
			return offered() == first+round-1 && ex.full.state("b", clock.Now()).ReopenAt.Equal(reopen)
		})
		at = reopen
	}
	t.Logf("%d rounds of a full peer: %d offers for %d segments owed (%d in the first round)", rounds, offered(), segments, first)
	budgetKept(t, a, ids)

	recv := newNode(t) // b acknowledges each segment at once from here on
	b.mu.Lock()
	b.full, b.store = false, recv.store
	b.mu.Unlock()
	clock.set(at)
	ex.Kick()
	for _, id := range ids {
		a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
}

// TestResetCircuitsClosesRoom: the operator's (or the peer's own) word
// that a peer is back closes its room circuit too.
func TestResetCircuitsClosesRoom(t *testing.T) {
	f := newFixture(t, ack, ack)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ex := f.executor(t, func(c *Config) { c.Now = func() time.Time { return t0 } })
	ex.refused("b", t0, &wire.NackError{Nack: wire.Nack{SegmentID: "s", Code: wire.NackQuota}})
	if c := ex.Circuits()[0]; c.Peer != "b" || c.Room != CircuitOpen {
		t.Fatalf("after a refusal for room: %+v", c)
	}
	ex.ResetCircuits("b")
	if c := ex.Circuits()[0]; c.Room != CircuitClosed {
		t.Fatalf("after ResetCircuits: %+v", c)
	}
}

// TestRoomDeferralReleasesDialProbe: a record that the dial circuit makes
// its probe and the room circuit then defers gives the probe back, so the
// dial circuit does not stay "probing" with no dial under way (which
// deferred the peer's records by a dial timeout at every claim).
func TestRoomDeferralReleasesDialProbe(t *testing.T) {
	f := newFixture(t, ack, ack)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &frozenClock{now: t0}
	ex := f.executor(t, func(c *Config) {
		c.Peers = map[string]string{"b": f.b.addr()}
		c.Policy = ledger.Policy{MaxRetries: 5, Initial: time.Minute, Max: time.Minute}
		c.Now = clock.Now
	})
	mustSchedule(t, f.a.led, "s", t0, "b")
	ex.circuits.dialed("b", t0, errString("connection refused"))                                                    // dial circuit open until t0+1m
	ex.refused("b", t0.Add(30*time.Second), &wire.NackError{Nack: wire.Nack{SegmentID: "x", Code: wire.NackQuota}}) // room open until t0+1m30s
	clock.set(t0.Add(time.Minute))
	if _, ok, _, err := ex.claimNext(); err != nil || ok {
		t.Fatalf("claimed %v (%v) while the room circuit is open", ok, err)
	}
	if c := ex.Circuits()[0]; c.State != CircuitHalfOpen || c.Probing || c.Room != CircuitOpen {
		t.Fatalf("circuits after the room deferral: %+v; want the dial circuit half-open and not probing", c)
	}
	r, err := f.a.led.Get("s", "b")
	if err != nil || !r.NextAttemptAfter.Equal(t0.Add(90*time.Second)) || r.Attempts != 0 {
		t.Fatalf("record %+v (%v); want deferred to the room circuit's reopen, no attempt", r, err)
	}
}
