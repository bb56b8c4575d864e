package relay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
)

func peersOf(t *testing.T, led *ledger.Ledger, seg string) map[string]ledger.State {
	t.Helper()
	rs, err := led.ListBySegment(seg)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ledger.State{}
	for _, r := range rs {
		out[r.PeerID] = r.State
	}
	return out
}

// TestRetentionAndPurgeAcrossRestarts: a segment relayed under one_peer
// and evicted, with b acked and c deadlettered. Its records stay while the
// deadletter stands; the operator purges it; a restart must not owe the
// evicted segment to c again; once the retention window has passed the
// acked record goes too, and a further restart creates nothing. A segment
// still stored whose deadletter is purged is owed again (documented).
func TestRetentionAndPurgeAcrossRestarts(t *testing.T) {
	f := newFixture(t, ack, nack(wire.NackInternal))
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	const retention = 24 * time.Hour
	mod := func(c *Config) {
		c.Condition, c.EvictOnRelay, c.Retention, c.Now = ledger.OnePeer, true, retention, clock
		c.Policy = ledger.Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}
	}
	ex := f.executor(t, mod)
	if err := ex.Schedule(f.a.put(t, "s", []byte("relay me"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Run(ctx) }()
	f.a.waitRecord(t, "s", "b", inState(ledger.StateAcked))
	f.a.waitRecord(t, "s", "c", inState(ledger.StateDeadletter))
	waitEvicted(t, f.a, "s")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	restart := func() ReconcileReport {
		t.Helper()
		rep, err := f.executor(t, mod).Reconcile()
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	advance(2 * retention)
	if rep := restart(); rep.Removed != 0 || rep.Scheduled != 0 {
		t.Fatalf("restart with a deadletter standing: %+v; want nothing removed or scheduled", rep)
	}
	if got := peersOf(t, f.a.led, "s"); len(got) != 2 {
		t.Fatalf("records %v; the deadletter must keep the segment's records", got)
	}
	if rs, err := f.a.led.Purge("s", "c"); err != nil || len(rs) != 1 {
		t.Fatalf("purge: %v, %v", rs, err)
	}
	// The acked record is older than the window: this restart removes it.
	// Nothing is owed to c: the segment is no longer stored.
	if rep := restart(); rep.Removed != 1 || rep.Scheduled != 0 {
		t.Fatalf("restart after purge: %+v; want the acked record removed and nothing scheduled", rep)
	}
	if got := peersOf(t, f.a.led, "s"); len(got) != 0 {
		t.Fatalf("records %v after retention", got)
	}
	if rep := restart(); rep.Removed != 0 || rep.Scheduled != 0 {
		t.Fatalf("second restart: %+v", rep)
	}

	// A stored segment: acked records are never removed, and a purged
	// deadletter is owed again at the next start, as documented.
	f.a.put(t, "kept", []byte("still here"))
	mustSchedule(t, f.a.led, "kept", clock(), "b", "c")
	for peer, ok := range map[string]bool{"b": true, "c": false} {
		mustClaim(t, f.a.led, "kept", peer, clock())
		var err error
		if ok {
			_, err = f.a.led.TransitionAcked("kept", peer, clock())
		} else {
			_, err = f.a.led.TransitionFailed("kept", peer, errString("boom"), clock(), ledger.Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if rs, err := f.a.led.Purge("kept", "c"); err != nil || len(rs) != 1 {
		t.Fatalf("purge: %v, %v", rs, err)
	}
	advance(2 * retention)
	// evict_on_relay is off here so that "kept" stays stored.
	ex2 := f.executor(t, func(c *Config) { mod(c); c.EvictOnRelay = false })
	rep, err := ex2.Reconcile()
	if err != nil {
		t.Fatal(err)
	}
	got := peersOf(t, f.a.led, "kept")
	if rep.Scheduled != 1 || rep.Removed != 0 || got["b"] != ledger.StateAcked || got["c"] != ledger.StateScheduled {
		t.Fatalf("stored segment after purge and restart: report %+v, records %v; want c scheduled again, b kept", rep, got)
	}
}

func TestRetentionInterval(t *testing.T) {
	for _, tc := range []struct{ retention, want time.Duration }{
		{time.Hour, 7*time.Minute + 30*time.Second},
		{time.Minute, time.Minute},
		{7 * 24 * time.Hour, time.Hour},
	} {
		if got := retentionInterval(tc.retention); got != tc.want {
			t.Errorf("retentionInterval(%v) = %v, want %v", tc.retention, got, tc.want)
		}
	}
}
