package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	pkiDir string
	a      *node
	b, c   *peer
}

// newFixture: sender "a" with peers "b" and "c", scripted receivers.
func newFixture(t *testing.T, bScript, cScript reply) *fixture {
	t.Helper()
	dir := pkitest.New(t, "a", "b", "c")
	f := &fixture{pkiDir: dir, a: newNode(t)}
	f.b = newPeer(t, newTransport(t, dir, "b", "a"), bScript)
	f.c = newPeer(t, newTransport(t, dir, "c", "a"), cScript)
	return f
}

func (f *fixture) executor(t *testing.T, mod func(*Config)) *Executor {
	t.Helper()
	cfg := Config{
		Peers:      map[string]string{"b": f.b.addr(), "c": f.c.addr()},
		Condition:  ledger.AllPeers,
		Policy:     testPolicy(3),
		Workers:    2,
		AckTimeout: 5 * time.Second,
		Log:        quietLog(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	ex, err := New(cfg, f.a.led, f.a.store, newTransport(t, f.pkiDir, "a", "b", "c"))
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

func TestNewRefusesBadConfig(t *testing.T) {
	n := newNode(t)
	tr := newTransport(t, pkitest.New(t, "a"), "a")
	good := Config{Condition: ledger.OnePeer, Policy: testPolicy(1)}
	cases := map[string]func(*Config){
		"unknown condition": func(c *Config) { c.Condition = "most" },
		"bad policy":        func(c *Config) { c.Policy.MaxRetries = 0 },
		"bad peer id":       func(c *Config) { c.Peers = map[string]string{"../x": "127.0.0.1:1"} },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := good
			mod(&cfg)
			if _, err := New(cfg, n.led, n.store, tr); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
	if _, err := New(good, n.led, n.store, tr); err != nil {
		t.Fatalf("good config refused: %v", err)
	}
}

func TestDeliverMarksRelayed(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex := f.executor(t, nil)
	e := f.a.put(t, "seg-1", []byte("hello edge"))
	if err := ex.Schedule(e); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	for _, p := range []string{"b", "c"} {
		r := f.a.waitRecord(t, "seg-1", p, inState(ledger.StateAcked))
		if r.Attempts != 1 {
			t.Errorf("%s: attempts %d, want 1", p, r.Attempts)
		}
	}
	waitRelayed(t, f.a, "seg-1")
}

func waitRelayed(t *testing.T, n *node, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		e, err := n.store.Stat(id)
		if err != nil {
			t.Fatal(err)
		}
		if e.Relayed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not marked relayed", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFailedAttempts: every way an attempt can fail leaves the record
// Failed with back-off and the reason in LastError, and never Acked.
func TestFailedAttempts(t *testing.T) {
	cases := []struct {
		name   string
		script reply
		want   string
	}{
		{"nack", nack(wire.NackQuota), "quota"},
		{"ack for another segment", func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
			if c.DiscardSegment(ctx, o) != nil {
				return false
			}
			return c.SendAck(ctx, "other-segment") == nil
		}, "another segment"},
		{"no reply (late ack)", func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
			c.DiscardSegment(ctx, o)
			<-ctx.Done() // never answer
			return false
		}, "no ACK within ack_timeout"},
		{"closed without reply", func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
			c.DiscardSegment(ctx, o)
			return false
		}, "EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.script, ack)
			now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			ex := f.executor(t, func(c *Config) {
				c.Peers = map[string]string{"b": f.b.addr()}
				c.AckTimeout = 300 * time.Millisecond
				c.Policy = ledger.Policy{MaxRetries: 5, Initial: time.Hour, Max: time.Hour}
				c.Now = func() time.Time { return now }
			})
			if err := ex.Schedule(f.a.put(t, "seg-1", []byte("payload"))); err != nil {
				t.Fatal(err)
			}
			run(t, ex)
			r := f.a.waitRecord(t, "seg-1", "b", inState(ledger.StateFailed))
			if r.Attempts != 1 || !r.NextAttemptAfter.Equal(now.Add(time.Hour)) {
				t.Errorf("record %+v: want 1 attempt, next attempt at now+1h", r)
			}
			if !strings.Contains(r.LastError, tc.want) {
				t.Errorf("LastError %q does not mention %q", r.LastError, tc.want)
			}
			if e, _ := f.a.store.Stat("seg-1"); e.Relayed {
				t.Error("segment marked relayed without an ACK")
			}
		})
	}
}

func TestDeadletterAtMaxRetries(t *testing.T) {
	f := newFixture(t, nack(wire.NackInternal), ack)
	ex := f.executor(t, func(c *Config) { c.Peers = map[string]string{"b": f.b.addr()} })
	if err := ex.Schedule(f.a.put(t, "seg-1", []byte("payload"))); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	r := f.a.waitRecord(t, "seg-1", "b", inState(ledger.StateDeadletter))
	if r.Attempts != 3 {
		t.Fatalf("deadlettered after %d attempts, want max_retries=3", r.Attempts)
	}
	if got := len(f.b.received()); got != 3 {
		t.Fatalf("peer saw %d offers, want 3", got)
	}
	// Operator retry: a fresh budget, and this time the peer accepts.
	f.b.setScript(ack)
	if rs, err := f.a.led.RetryDeadletter("seg-1", "b", time.Now()); err != nil || len(rs) != 1 {
		t.Fatalf("retry: %v, %v", rs, err)
	}
	ex.Kick()
	r = f.a.waitRecord(t, "seg-1", "b", inState(ledger.StateAcked))
	if r.Attempts != 4 {
		t.Fatalf("attempts %d after retry, want 4 (monotonic)", r.Attempts)
	}
}

// TestClaimOrderIsLedgerOrder: one worker, equal due times: segments go
// out in (SegmentID, PeerID) order whatever order they were stored in.
func TestClaimOrderIsLedgerOrder(t *testing.T) {
	f := newFixture(t, ack, ack)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ex := f.executor(t, func(c *Config) {
		c.Workers = 1
		c.Peers = map[string]string{"b": f.b.addr()}
		c.Now = func() time.Time { return now }
	})
	ids := []string{"s-09", "s-03", "s-07", "s-01", "s-05", "s-02", "s-08", "s-04", "s-06"}
	for _, id := range ids {
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	for _, id := range ids {
		f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	want := slices.Sorted(slices.Values(ids))
	if got := f.b.received(); !slices.Equal(got, want) {
		t.Fatalf("delivery order %v, want %v", got, want)
	}
}

// TestStalePooledConnection: the receiver closes every connection right
// after its ACK, so each later segment first finds a dead pooled
// connection; the attempt must still succeed, as one attempt.
func TestStalePooledConnection(t *testing.T) {
	closeAfterAck := func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
		ack(ctx, c, o)
		return false
	}
	f := newFixture(t, closeAfterAck, ack)
	ex := f.executor(t, func(c *Config) {
		c.Workers = 1
		c.Peers = map[string]string{"b": f.b.addr()}
	})
	run(t, ex)
	for i := range 4 {
		id := fmt.Sprintf("s-%d", i)
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
		r := f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
		if r.Attempts != 1 {
			t.Fatalf("%s: %d attempts, want 1", id, r.Attempts)
		}
	}
}

// TestConnectionReused: a stream of segments to one peer shares a
// connection instead of a handshake per segment.
func TestConnectionReused(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex := f.executor(t, func(c *Config) {
		c.Workers = 1
		c.Peers = map[string]string{"b": f.b.addr()}
	})
	run(t, ex)
	for i := range 5 {
		id := fmt.Sprintf("s-%d", i)
		if err := ex.Schedule(f.a.put(t, id, []byte(id))); err != nil {
			t.Fatal(err)
		}
		f.a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	f.b.mu.Lock()
	conns := f.b.conns
	f.b.mu.Unlock()
	if conns != 1 {
		t.Fatalf("%d connections for 5 sequential segments, want 1", conns)
	}
}

func TestUnknownPeerAndMissingSegment(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex := f.executor(t, func(c *Config) { c.Peers = map[string]string{"b": f.b.addr()} })
	now := time.Now()
	// A record for a peer no longer configured, and one for a segment that
	// is no longer stored.
	f.a.put(t, "kept", []byte("x"))
	if _, err := f.a.led.EnsureScheduled("kept", []string{"gone-peer"}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.led.EnsureScheduled("vanished", []string{"b"}, now); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	r := f.a.waitRecord(t, "kept", "gone-peer", inState(ledger.StateDeadletter))
	if r.Attempts != 3 || !strings.Contains(r.LastError, "known_peers") {
		t.Errorf("unknown peer record %+v", r)
	}
	r = f.a.waitRecord(t, "vanished", "b", inState(ledger.StateDeadletter))
	if r.Attempts != 1 || !strings.Contains(r.LastError, "missing") {
		t.Errorf("missing segment record %+v: want deadletter after its first attempt", r)
	}
	if got := f.b.received(); len(got) != 0 {
		t.Errorf("peer received %v", got)
	}
}

// TestRequiredPeersExcludeSource: a segment received from b is owed to c
// only, and its success condition is judged over c alone.
func TestRequiredPeersExcludeSource(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex := f.executor(t, nil)
	content := []byte("from b")
	e, err := f.a.store.Write("from-b", int64(len(content)), sha(content), strings.NewReader(string(content)), "b")
	if err != nil {
		t.Fatal(err)
	}
	if got := ex.RequiredPeers(e); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("required peers %v, want [c]", got)
	}
	if err := ex.Schedule(e); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	f.a.waitRecord(t, "from-b", "c", inState(ledger.StateAcked))
	waitRelayed(t, f.a, "from-b")
	if _, err := f.a.led.Get("from-b", "b"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("record for the sender: %v", err)
	}
}

// gate blocks the receiver until the test opens it.
type gate struct {
	ch     chan struct{}
	passed atomic.Int32
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) then(r reply) reply {
	return func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
		select {
		case <-g.ch:
		case <-ctx.Done():
			return false
		}
		g.passed.Add(1)
		return r(ctx, c, o)
	}
}

func TestEvictOnRelay(t *testing.T) {
	t.Run("all_peers waits for every ack", func(t *testing.T) {
		g := newGate()
		f := newFixture(t, ack, g.then(ack))
		ex := f.executor(t, func(c *Config) { c.EvictOnRelay = true })
		if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
			t.Fatal(err)
		}
		run(t, ex)
		f.a.waitRecord(t, "seg", "b", inState(ledger.StateAcked))
		// b acked, c has not: the condition is unmet and the segment stays.
		if e, err := f.a.store.Stat("seg"); err != nil || e.Relayed {
			t.Fatalf("after one of two acks: entry %+v, err %v; want stored, not relayed", e, err)
		}
		close(g.ch)
		f.a.waitRecord(t, "seg", "c", inState(ledger.StateAcked))
		waitEvicted(t, f.a, "seg")
	})
	t.Run("one_peer waits for the other peer's delivery to finish", func(t *testing.T) {
		g := newGate()
		f := newFixture(t, ack, g.then(nack(wire.NackInternal)))
		ex := f.executor(t, func(c *Config) {
			c.EvictOnRelay = true
			c.Condition = ledger.OnePeer
			c.Policy = testPolicy(2)
		})
		if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
			t.Fatal(err)
		}
		run(t, ex)
		f.a.waitRecord(t, "seg", "b", inState(ledger.StateAcked))
		waitRelayed(t, f.a, "seg")
		// Met, but c's delivery is still owed: the gate keeps the file.
		if ok, err := f.a.led.CanEvict("seg", []string{"b", "c"}, ledger.OnePeer); err != nil || ok {
			t.Fatalf("CanEvict with c pending = %v, %v", ok, err)
		}
		if _, err := f.a.store.Stat("seg"); err != nil {
			t.Fatalf("evicted while c's delivery was pending: %v", err)
		}
		close(g.ch)
		f.a.waitRecord(t, "seg", "c", inState(ledger.StateDeadletter))
		waitEvicted(t, f.a, "seg")
	})
	t.Run("off keeps the segment", func(t *testing.T) {
		f := newFixture(t, ack, ack)
		ex := f.executor(t, nil)
		if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
			t.Fatal(err)
		}
		run(t, ex)
		f.a.waitRecord(t, "seg", "c", inState(ledger.StateAcked))
		waitRelayed(t, f.a, "seg")
		if _, err := f.a.store.Stat("seg"); err != nil {
			t.Fatal(err)
		}
	})
}

func waitEvicted(t *testing.T, n *node, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		// The store frees quota after the file is gone, a moment after the
		// index entry: wait for both.
		_, err := n.store.Stat(id)
		u := n.store.Usage()
		if errors.Is(err, segstore.ErrNotFound) && u.Segments == 0 && u.Bytes == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not evicted (stat err %v, usage %+v)", id, err, u)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRecordDueWhileLooking: a failed record that comes due between the
// claim scan and the computation of the wait must be picked up at once.
// The clock advances 10ms per reading and the back-off is 15ms, so the
// worker always sees the record not yet due when it scans and overdue
// when it computes how long to sleep (a negative wait once meant "sleep
// until woken", and the record was never retried).
func TestRecordDueWhileLooking(t *testing.T) {
	f := newFixture(t, nack(wire.NackInternal), ack)
	var ticks atomic.Int64
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ex := f.executor(t, func(c *Config) {
		c.Workers = 1
		c.Peers = map[string]string{"b": f.b.addr()}
		c.Policy = ledger.Policy{MaxRetries: 3, Initial: 15 * time.Millisecond, Max: 15 * time.Millisecond}
		c.Now = func() time.Time { return base.Add(time.Duration(ticks.Add(1)) * 10 * time.Millisecond) }
	})
	if err := ex.Schedule(f.a.put(t, "seg-1", []byte("payload"))); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	f.a.waitRecord(t, "seg-1", "b", inState(ledger.StateDeadletter))
}

// TestSuccessReportedOnce: when the acks of several peers finish at once,
// several workers evaluate the condition concurrently. The "relay
// success" line and edged_relay_success_total must still count the
// segment once: each caller read the entry before any of them marked it,
// so every one of them used to report the success.
func TestSuccessReportedOnce(t *testing.T) {
	f := newFixture(t, ack, ack)
	var relayed atomic.Int32
	ex := f.executor(t, func(c *Config) { c.Observer.Relayed = func(string) { relayed.Add(1) } })
	if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, p := range []string{"b", "c"} {
		if _, ok, err := f.a.led.TryTransitionInflight("seg", p, now); !ok || err != nil {
			t.Fatalf("claim %s: %v %v", p, ok, err)
		}
		if _, err := f.a.led.TransitionAcked("seg", p, now); err != nil {
			t.Fatal(err)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ex.checkSuccessCondition("seg")
		}()
	}
	close(start)
	wg.Wait()
	if n := relayed.Load(); n != 1 {
		t.Fatalf("success reported %d times for one segment", n)
	}
	if e, err := f.a.store.Stat("seg"); err != nil || !e.Relayed {
		t.Fatalf("entry %+v, err %v: want relayed", e, err)
	}
}

// TestEvictOnRelayAgainAfterReceivedAgain: a forwarder may receive a
// segment it already relayed and evicted (the sender's ACK was late, so
// it resent after the eviction). Its ledger records are all Acked, so
// nothing is scheduled and no terminal transition ever happens again;
// Schedule must still judge the success condition, or the second copy
// stays stored, never marked relayed, holding quota until a restart.
func TestEvictOnRelayAgainAfterReceivedAgain(t *testing.T) {
	f := newFixture(t, ack, ack)
	ex := f.executor(t, func(c *Config) { c.EvictOnRelay = true })
	if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
		t.Fatal(err)
	}
	run(t, ex)
	waitEvicted(t, f.a, "seg")
	if err := ex.Schedule(f.a.put(t, "seg", []byte("content"))); err != nil {
		t.Fatal(err)
	}
	if e, err := f.a.store.Stat("seg"); !errors.Is(err, segstore.ErrNotFound) {
		t.Fatalf("second copy of a segment every peer acked: entry %+v, err %v; want evicted", e, err)
	}
	if u := f.a.store.Usage(); u.Bytes != 0 || u.Segments != 0 {
		t.Fatalf("quota still held: %+v", u)
	}
}
