package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
	"github.com/relay-dev/relay/internal/silenttest"
)

// TestCircuitStateMachine walks one peer's circuit through its states with
// explicit times.
func TestCircuitStateMachine(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p := ledger.Policy{MaxRetries: 5, Initial: time.Minute, Max: 3 * time.Minute}
	cs := newCircuits(p, 10*time.Second)
	boom := errors.New("connection refused")
	want := func(now time.Time, state CircuitState, failures int, reopen time.Time) {
		t.Helper()
		got := cs.state("d", now)
		if got.State != state || got.Failures != failures || !got.ReopenAt.Equal(reopen) {
			t.Fatalf("at %v: %+v, want %s failures %d reopen %v", now.Sub(t0), got, state, failures, reopen.Sub(t0))
		}
	}
	admitted := func(now time.Time) admission {
		t.Helper()
		a := cs.admit("d", now)
		if !a.deferUntil.IsZero() {
			t.Fatalf("at %v: deferred to %v, want admitted", now.Sub(t0), a.deferUntil.Sub(t0))
		}
		return a
	}
	deferredTo := func(now, until time.Time) {
		t.Helper()
		if a := cs.admit("d", now); !a.deferUntil.Equal(until) || a.probe != 0 {
			t.Fatalf("at %v: %+v, want deferral to %v", now.Sub(t0), a, until.Sub(t0))
		}
	}

	want(t0, CircuitClosed, 0, time.Time{})
	if a := admitted(t0); a.probe != 0 {
		t.Fatal("a closed circuit hands out probes")
	}
	cs.dialed("d", t0, boom) // first failure: open for Backoff(1) = 1m
	want(t0, CircuitOpen, 1, t0.Add(time.Minute))
	cs.dialed("d", t0.Add(time.Second), boom) // a dial that started earlier: same round
	want(t0, CircuitOpen, 1, t0.Add(time.Minute))
	deferredTo(t0.Add(30*time.Second), t0.Add(time.Minute))

	// Half-open: exactly one probe; the others wait for its dial deadline.
	t1 := t0.Add(time.Minute)
	want(t1, CircuitHalfOpen, 1, t1)
	a := admitted(t1)
	if a.probe == 0 {
		t.Fatal("half-open circuit admitted a record without making it the probe")
	}
	deferredTo(t1, t1.Add(10*time.Second))
	// A lost claim releases the probe; a stale token changes nothing.
	cs.release("d", a.probe+1)
	deferredTo(t1, t1.Add(10*time.Second))
	cs.release("d", a.probe)
	a = admitted(t1)
	if a.probe == 0 {
		t.Fatal("released probe was not handed out again")
	}
	cs.dialed("d", t1, boom) // probe failed: open for Backoff(2) = 2m
	want(t1, CircuitOpen, 2, t1.Add(2*time.Minute))
	cs.release("d", a.probe) // after the dial decided: no effect
	want(t1, CircuitOpen, 2, t1.Add(2*time.Minute))

	t2 := t1.Add(2 * time.Minute)
	a = admitted(t2)
	cs.dialed("d", t2, boom) // Backoff(3) = 3m = Max
	want(t2, CircuitOpen, 3, t2.Add(3*time.Minute))
	t3 := t2.Add(3 * time.Minute)
	admitted(t3)
	cs.dialed("d", t3, boom) // capped at Max
	want(t3, CircuitOpen, 4, t3.Add(3*time.Minute))

	t4 := t3.Add(3 * time.Minute)
	if a = admitted(t4); a.probe == 0 {
		t.Fatal("no probe")
	}
	cs.dialed("d", t4, nil) // probe succeeded
	want(t4, CircuitClosed, 0, time.Time{})
	if got := cs.state("d", t4); got.LastError != boom.Error() {
		t.Fatalf("last error %q lost when the circuit closed", got.LastError)
	}
	if a := admitted(t4); a.probe != 0 {
		t.Fatal("closed circuit hands out probes")
	}
	cs.dialed("d", t4, boom)
	want(t4, CircuitOpen, 1, t4.Add(time.Minute))
	cs.reset("")
	want(t4, CircuitClosed, 0, time.Time{})
	if got := cs.state("other", t4); got.State != CircuitClosed {
		t.Fatalf("another peer's circuit is %s", got.State)
	}
}

// countingDialer counts dials per peer and can point a peer at a closed
// port (a real, refused TCP connect) to take it down.
type countingDialer struct {
	Dialer
	dead string // a 127.0.0.1 address nothing listens on

	mu    sync.Mutex
	dials map[string]int
	down  map[string]bool
}

func newCountingDialer(t *testing.T, d Dialer) *countingDialer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	return &countingDialer{Dialer: d, dead: dead, dials: map[string]int{}, down: map[string]bool{}}
}

func (d *countingDialer) Dial(ctx context.Context, addr, peer string) (*wire.Conn, error) {
	d.mu.Lock()
	d.dials[peer]++
	if d.down[peer] {
		addr = d.dead
	}
	d.mu.Unlock()
	return d.Dialer.Dial(ctx, addr, peer)
}

func (d *countingDialer) count(peer string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[peer]
}

func (d *countingDialer) setDown(peer string, down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down[peer] = down
}

// A peer this process has not dialled yet is reported as such, not as
// reachable: after a restart, a peer that is down and owed nothing due
// showed "reachable" in edgectl status.
func TestNotDialedUntilDialled(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex, err := New(Config{
		Peers:     map[string]string{"b": f.b.addr(), "d": silenttest.Addr(t)},
		Condition: ledger.AllPeers,
		Policy:    ledger.Policy{MaxRetries: 10, Initial: time.Hour, Max: time.Hour},
		Workers:   1, DialTimeout: 250 * time.Millisecond, AckTimeout: 5 * time.Second,
		Log: quietLog(t),
	}, f.a.led, f.a.store, newTransport(t, f.pkiDir, "a", "b", "d"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ex.Circuits() {
		if c.State != CircuitClosed || !c.NotDialed {
			t.Fatalf("before any dial: %+v, want closed and not dialled", c)
		}
	}
	if err := ex.Schedule(f.a.put(t, "s", []byte("s"))); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	f.a.waitRecord(t, "s", "b", inState(ledger.StateAcked))
	waitCond(t, "d dialled and failed", func() bool { return ex.Circuits()[1].State != CircuitClosed })
	for _, c := range ex.Circuits() {
		if c.NotDialed {
			t.Fatalf("after dials to both: %+v still not dialled", c)
		}
	}
}

// TestDeadPeerDoesNotStarveHealthyPeer is the regression for a silent,
// down peer: one worker, many segments owed to a dead peer d and a
// healthy peer b. Without the dial circuit every d record costs a dial
// timeout before b's next segment; with it d is dialled once, its other
// records are deferred without an attempt, and b gets everything.
func TestDeadPeerDoesNotStarveHealthyPeer(t *testing.T) {
	const segments = 40
	f := newFixture(t, ack, ack)
	dialer := newCountingDialer(t, newTransport(t, f.pkiDir, "a", "b", "d"))
	var deferred atomic.Int64
	ex, err := New(Config{
		Peers:     map[string]string{"b": f.b.addr(), "d": silenttest.Addr(t)},
		Condition: ledger.AllPeers,
		// The circuit stays open far longer than the test runs.
		Policy:      ledger.Policy{MaxRetries: 10, Initial: time.Hour, Max: time.Hour},
		Workers:     1,
		DialTimeout: 250 * time.Millisecond,
		AckTimeout:  5 * time.Second,
		Log:         quietLog(t),
		Observer:    Observer{Deferred: func(_ string, n int) { deferred.Add(int64(n)) }},
	}, f.a.led, f.a.store, dialer)
	if err != nil {
		t.Fatal(err)
	}
	for i := range segments {
		id := fmt.Sprintf("s-%02d", i)
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for i := range segments {
		f.a.waitRecord(t, fmt.Sprintf("s-%02d", i), "b", inState(ledger.StateAcked))
	}
	// Dialled once: the first record in ledger order (s-00/d comes after
	// s-00/b). Every later d record found the circuit open.
	if n := dialer.count("d"); n != 1 {
		t.Fatalf("%d dials to the dead peer for %d segments, want 1", n, segments)
	}
	waitCond(t, "every d record deferred", func() bool { return deferred.Load() == segments-1 })
	c := ex.Circuits()
	if len(c) != 2 || c[0].State != CircuitClosed || c[1].Peer != "d" || c[1].State != CircuitOpen || c[1].Failures != 1 {
		t.Fatalf("circuits %+v", c)
	}
	reopen := c[1].ReopenAt
	for i := range segments {
		r, err := f.a.led.Get(fmt.Sprintf("s-%02d", i), "d")
		if err != nil {
			t.Fatal(err)
		}
		// s-00/d failed its attempt a moment after its dial failed (which
		// opened the circuit), so its own back-off ends just after reopen.
		wantAttempts, wantState, okNext := 0, ledger.StateScheduled, r.NextAttemptAfter.Equal(reopen)
		if i == 0 {
			wantAttempts, wantState, okNext = 1, ledger.StateFailed, !r.NextAttemptAfter.Before(reopen)
		}
		if r.Attempts != wantAttempts || r.State != wantState || !okNext {
			t.Errorf("%s/d: %s attempts %d next %v; want %s attempts %d next %v (the circuit's reopen time)",
				r.SegmentID, r.State, r.Attempts, r.NextAttemptAfter, wantState, wantAttempts, reopen)
		}
	}
}

// TestCircuitHalfOpenProbe drives the circuit with a frozen clock: one
// probe per reopen, back-off growing between rounds, other records
// deferred without attempts, and a successful probe releasing them all.
func TestCircuitHalfOpenProbe(t *testing.T) {
	f := newFixture(t, ack, ack)
	dialer := newCountingDialer(t, newTransport(t, f.pkiDir, "a", "b"))
	dialer.setDown("b", true)
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	t0 := now
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	setClock := func(t time.Time) { mu.Lock(); defer mu.Unlock(); now = t }
	ex, err := New(Config{
		Peers:       map[string]string{"b": f.b.addr()},
		Condition:   ledger.AllPeers,
		Policy:      ledger.Policy{MaxRetries: 10, Initial: time.Minute, Max: 4 * time.Minute},
		Workers:     1,
		DialTimeout: 2 * time.Second,
		Now:         clock,
		Log:         quietLog(t),
	}, f.a.led, f.a.store, dialer)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"s-0", "s-1", "s-2"}
	for _, id := range ids {
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	// settled: nothing due at the frozen now, and the circuit as given.
	settled := func(dials, failures int, reopen time.Time) {
		t.Helper()
		waitCond(t, fmt.Sprintf("%d dials, circuit open with %d failures", dials, failures), func() bool {
			due, err := f.a.led.Pending(clock(), 0)
			c := ex.Circuits()[0]
			return err == nil && len(due) == 0 && dialer.count("b") == dials &&
				c.State == CircuitOpen && c.Failures == failures && c.ReopenAt.Equal(reopen)
		})
	}
	attempts := func(want ...int) {
		t.Helper()
		for i, id := range ids {
			r, err := f.a.led.Get(id, "b")
			if err != nil {
				t.Fatal(err)
			}
			if r.Attempts != want[i] {
				t.Errorf("%s: %d attempts, want %d", id, r.Attempts, want[i])
			}
		}
	}
	settled(1, 1, t0.Add(time.Minute))
	attempts(1, 0, 0)

	setClock(t0.Add(time.Minute)) // half-open: s-0 (first in ledger order) probes and fails
	ex.Kick()
	settled(2, 2, t0.Add(3*time.Minute))
	attempts(2, 0, 0)

	dialer.setDown("b", false)
	setClock(t0.Add(3 * time.Minute)) // the probe succeeds; the rest follow on its connection
	ex.Kick()
	for _, id := range ids {
		f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	attempts(3, 1, 1)
	if c := ex.Circuits()[0]; c.State != CircuitClosed {
		t.Fatalf("circuit %+v after a successful probe", c)
	}
	if n := dialer.count("b"); n != 3 {
		t.Fatalf("%d dials, want 3 (one per round; the deferred records reuse the probe's connection)", n)
	}
}

// waitCond polls cond until it holds, for at most waitFor.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRestartReleasesDeferrals: records deferred by one process's dial
// circuit, and the back-off of the attempt that opened it, are not waited
// out by the next process when the peer answers at once. The clock is
// frozen before the old circuit's reopen time, so whatever is delivered
// was due without it.
func TestRestartReleasesDeferrals(t *testing.T) {
	const segments = 6
	f := newFixture(t, ack, ack)
	dialer := newCountingDialer(t, newTransport(t, f.pkiDir, "a", "b"))
	dialer.setDown("b", true)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := Config{
		Peers:       map[string]string{"b": f.b.addr()},
		Condition:   ledger.AllPeers,
		Policy:      ledger.Policy{MaxRetries: 10, Initial: 5 * time.Minute, Max: 5 * time.Minute},
		Workers:     1,
		DialTimeout: 2 * time.Second,
		Now:         func() time.Time { return t0 },
		Log:         quietLog(t),
	}
	first, err := New(cfg, f.a.led, f.a.store, dialer)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range segments {
		id := fmt.Sprintf("s-%d", i)
		ids = append(ids, id)
		if err := first.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	waitCond(t, "one failed dial, the rest deferred", func() bool {
		due, err := f.a.led.Pending(t0, 0)
		return err == nil && len(due) == 0 && dialer.count("b") == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	reopen := t0.Add(5 * time.Minute)
	for i, id := range ids {
		r, err := f.a.led.Get(id, "b")
		if err != nil || r.NextAttemptAfter.Before(reopen) || (i > 0) != !r.DeferredFrom.IsZero() {
			t.Fatalf("%s before the restart: %+v (%v); want due at the circuit's reopen %v, deferred unless it was the dial", id, r, err, reopen)
		}
	}

	dialer.setDown("b", false)
	second, err := New(cfg, f.a.led, f.a.store, dialer)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := second.Reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Undeferred != segments-1 {
		t.Fatalf("reconcile released %d deferrals, want %d: %+v", rep.Undeferred, segments-1, rep)
	}
	run(t, second)
	for _, id := range ids {
		r := f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
		if want := map[bool]int{true: 2, false: 1}[id == "s-0"]; r.Attempts != want || r.BudgetUsed() != want {
			t.Errorf("%s: %d attempts, want %d (a deferral costs none)", id, r.Attempts, want)
		}
	}
	if n := dialer.count("b"); n != 2 {
		t.Fatalf("%d dials, want 2 (one per process)", n)
	}
}

// TestDeferralsBatchedForDownPeer counts the transactions that defer the
// backlog of a peer whose dial circuit opened: the claim scan doubles
// while it finds nothing to claim, so 2,000 due records take a handful of
// deferral transactions (127 at one per claimBatch).
func TestDeferralsBatchedForDownPeer(t *testing.T) {
	const records = 2000
	f := newFixture(t, ack, ack)
	dialer := newCountingDialer(t, newTransport(t, f.pkiDir, "a", "d"))
	dialer.setDown("d", true)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var deferred atomic.Int64
	ex, err := New(Config{
		Peers: map[string]string{"d": dialer.dead}, Condition: ledger.AllPeers,
		Policy:  ledger.Policy{MaxRetries: 10, Initial: time.Hour, Max: time.Hour},
		Workers: 1, DialTimeout: 2 * time.Second, Now: func() time.Time { return t0 }, Log: quietLog(t),
		Observer: Observer{Deferred: func(_ string, n int) { deferred.Add(int64(n)) }},
	}, f.a.led, f.a.store, dialer)
	if err != nil {
		t.Fatal(err)
	}
	// Only the first segment is stored: the others are deferred before
	// anything looks for them.
	f.a.put(t, "s-0000", []byte("s-0000"))
	owed := make([]ledger.Owed, records)
	for i := range owed {
		owed[i] = ledger.Owed{SegmentID: fmt.Sprintf("s-%04d", i), PeerIDs: []string{"d"}}
	}
	if _, err := f.a.led.EnsureScheduledAll(owed, t0); err != nil {
		t.Fatal(err)
	}
	before := commits(t, f.a.db)
	run(t, ex)
	waitCond(t, "one failed dial, the rest deferred", func() bool {
		due, err := f.a.led.Pending(t0, 0)
		return err == nil && len(due) == 0 && deferred.Load() == records-1
	})
	// One claim and one failed attempt, then the deferrals.
	got := commits(t, f.a.db) - before - 2
	t.Logf("%d records deferred in %d transactions", records-1, got)
	if got > 8 || dialer.count("d") != 1 {
		t.Fatalf("%d deferral transactions and %d dials, want at most 8 and 1", got, dialer.count("d"))
	}
}

// TestProbeDeferralFollowsBackoff: while the half-open probe dials, the
// peer's other due records wait at most until the circuit would reopen
// after a failed probe (backoff of the next round), not the probe's whole
// dial deadline: with relay.backoff.max below dial_timeout, a peer that
// comes back is noticed within backoff.max. Before, a probe refused at once
// left them deferred for the rest of the 10 s dial timeout.
func TestProbeDeferralFollowsBackoff(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p := ledger.Policy{MaxRetries: 3, Initial: 200 * time.Millisecond, Max: time.Second}
	cs := newCircuits(p, 10*time.Second)
	boom := errors.New("connection refused")
	cs.dialed("d", t0, boom) // open for Backoff(1) = 200ms
	t1 := t0.Add(200 * time.Millisecond)
	if a := cs.admit("d", t1); a.probe == 0 {
		t.Fatalf("half-open at %v: %+v, want the probe", t1.Sub(t0), a)
	}
	if a := cs.admit("d", t1); !a.deferUntil.Equal(t1.Add(p.Backoff(2))) {
		t.Fatalf("a record due while the probe dials: deferred to %v, want %v (Backoff(2)), not the dial deadline %v",
			a.deferUntil.Sub(t0), t1.Add(p.Backoff(2)).Sub(t0), t1.Add(10*time.Second).Sub(t0))
	}
	// The probe fails at once: the circuit reopens when those records are
	// due again.
	cs.dialed("d", t1, boom)
	if st := cs.state("d", t1); !st.ReopenAt.Equal(t1.Add(p.Backoff(2))) {
		t.Fatalf("reopen at %v, want %v", st.ReopenAt.Sub(t0), t1.Add(p.Backoff(2)).Sub(t0))
	}
}
