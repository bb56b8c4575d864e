package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReconcile covers each start-up repair on one ledger: an abandoned
// attempt, a record whose segment is gone, a retry-ready failure, a
// stored segment without records, and a relayed marker never written.
func TestReconcile(t *testing.T) {
	f := newFixture(t, ack, ack)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ex := f.executor(t, func(c *Config) {
		c.Now = func() time.Time { return now }
		c.Policy = ledger.Policy{MaxRetries: 5, Initial: time.Second, Max: time.Minute}
	})
	led := f.a.led
	past := now.Add(-time.Hour)

	// inflight: claimed, then the agent "crashed".
	f.a.put(t, "inflight", []byte("1"))
	mustSchedule(t, led, "inflight", past, "b", "c")
	mustClaim(t, led, "inflight", "b", past)

	// missing: records for a segment no longer stored.
	mustSchedule(t, led, "missing", past, "b")

	// ready: a failure whose back-off has passed.
	f.a.put(t, "ready", []byte("3"))
	mustSchedule(t, led, "ready", past, "b", "c")
	mustClaim(t, led, "ready", "b", past)
	if _, err := led.TransitionFailed("ready", "b", errString("boom"), past, ex.cfg.Policy); err != nil {
		t.Fatal(err)
	}

	// unscheduled: stored, no records.
	f.a.put(t, "unscheduled", []byte("4"))

	// acked: both peers acked but the relayed marker was never set.
	f.a.put(t, "acked", []byte("5"))
	mustSchedule(t, led, "acked", past, "b", "c")
	for _, p := range []string{"b", "c"} {
		mustClaim(t, led, "acked", p, past)
		if _, err := led.TransitionAcked("acked", p, past); err != nil {
			t.Fatal(err)
		}
	}

	rep, err := ex.Reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if rep.AbandonedInflight != 1 || rep.PrunedMissing != 1 || rep.Rescheduled != 1 || rep.Scheduled != 2 || rep.Segments != 4 {
		t.Fatalf("report %+v", rep)
	}
	want := map[[2]string]ledger.State{
		{"inflight", "b"}:    ledger.StateFailed,
		{"inflight", "c"}:    ledger.StateScheduled,
		{"missing", "b"}:     ledger.StateDeadletter,
		{"ready", "b"}:       ledger.StateScheduled,
		{"unscheduled", "b"}: ledger.StateScheduled,
		{"unscheduled", "c"}: ledger.StateScheduled,
		{"acked", "b"}:       ledger.StateAcked,
	}
	for k, st := range want {
		r, err := led.Get(k[0], k[1])
		if err != nil || r.State != st {
			t.Errorf("%s/%s: %v (err %v), want %v", k[0], k[1], r.State, err, st)
		}
	}
	if e, err := f.a.store.Stat("acked"); err != nil || !e.Relayed {
		t.Errorf("acked segment not marked relayed by reconcile: %+v %v", e, err)
	}
	// Idempotent: a second run changes nothing.
	rep, err = ex.Reconcile()
	if err != nil || rep.AbandonedInflight+rep.PrunedMissing+rep.Rescheduled+rep.Scheduled != 0 {
		t.Fatalf("second reconcile: %+v, %v", rep, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func mustSchedule(t *testing.T, l *ledger.Ledger, seg string, at time.Time, peers ...string) {
	t.Helper()
	if _, err := l.EnsureScheduled(seg, peers, at); err != nil {
		t.Fatal(err)
	}
}

func mustClaim(t *testing.T, l *ledger.Ledger, seg, peer string, at time.Time) {
	t.Helper()
	if _, ok, err := l.TryTransitionInflight(seg, peer, at); err != nil || !ok {
		t.Fatalf("claim %s/%s: %v %v", seg, peer, ok, err)
	}
}

// TestReconcileAfterPeerAdded: a segment relayed under all_peers to b
// alone is no longer relayed once c joins known_peers. Reconcile schedules
// c and clears the marker (relayed true beside met false contradicted each
// other, and status counted it); c's ACK marks it relayed again. Under
// one_peer b's ACK still meets the condition and the marker stays.
func TestReconcileAfterPeerAdded(t *testing.T) {
	for _, tc := range []struct {
		cond          ledger.Condition
		wantRelayed   bool
		wantUnrelayed int
	}{
		{ledger.AllPeers, false, 1},
		{ledger.OnePeer, true, 0},
	} {
		t.Run(string(tc.cond), func(t *testing.T) {
			f := newFixture(t, ack, ack)
			now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			led := f.a.led
			f.a.put(t, "s", []byte("x"))
			mustSchedule(t, led, "s", now, "b")
			mustClaim(t, led, "s", "b", now)
			if _, err := led.TransitionAcked("s", "b", now); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.a.store.MarkRelayed("s"); err != nil {
				t.Fatal(err)
			}
			ex := f.executor(t, func(c *Config) { c.Condition = tc.cond }) // peers b and c
			rep, err := ex.Reconcile()
			if err != nil {
				t.Fatal(err)
			}
			if rep.Scheduled != 1 || rep.Unrelayed != tc.wantUnrelayed {
				t.Fatalf("report %+v", rep)
			}
			e, err := f.a.store.Stat("s")
			if err != nil || e.Relayed != tc.wantRelayed {
				t.Fatalf("after reconcile: relayed %v (err %v), want %v", e.Relayed, err, tc.wantRelayed)
			}
			a, err := led.Assurance("s", ex.RequiredPeers(e), tc.cond)
			if err != nil || a.Met != e.Relayed {
				t.Fatalf("met %v, relayed %v (err %v)", a.Met, e.Relayed, err)
			}
			run(t, ex)
			f.a.waitRecord(t, "s", "c", inState(ledger.StateAcked))
			deadline := time.Now().Add(waitFor)
			for {
				if e, err := f.a.store.Stat("s"); err == nil && e.Relayed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("not relayed again after c acked")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
