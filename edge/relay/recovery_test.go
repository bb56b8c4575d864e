package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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

// commits is the number of write transactions committed on db so far
// (bbolt's transaction id counts them; each costs two fsyncs).
func commits(t *testing.T, db *bolt.DB) int {
	t.Helper()
	var id int
	if err := db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestReconcileCommitsPerBatch counts the write transactions start-up
// reconciliation commits when every stored segment is owed to a new peer:
// after the peer was added (a record each, and under all_peers each
// relayed marker cleared) and after the database was rebuilt (every
// record). It is one per reconcileBatch segments, not one or two per
// segment (80 here before batching), and none at all for a start with
// nothing to do. The batch is made smaller than reconcileBatch so that two
// batches take few segments to store.
func TestReconcileCommitsPerBatch(t *testing.T) {
	const batch, n, batches = 32, 40, 2
	f := newFixture(t, ack, ack)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("s-%05d", i)
		ids = append(ids, id)
		f.a.put(t, id, []byte(id))
	}
	// Delivered to b and relayed, as a node with b its only peer left it.
	pairs := make([]ledger.Pair, n)
	for i, id := range ids {
		mustSchedule(t, f.a.led, id, now.Add(-time.Hour), "b")
		pairs[i] = ledger.Pair{SegmentID: id, PeerID: "b"}
	}
	if _, err := f.a.led.ClaimBatch(pairs, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.led.AckBatch(pairs, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.store.MarkRelayedAll(ids); err != nil {
		t.Fatal(err)
	}
	executor := func() *Executor {
		ex := f.executor(t, func(c *Config) {
			c.Now = func() time.Time { return now }
			c.Retention = 7 * 24 * time.Hour
		})
		ex.reconcileBatch = batch
		return ex
	}
	reconcile := func(what string, wantScheduled, wantUnrelayed, wantCommits int) {
		t.Helper()
		before := commits(t, f.a.db)
		rep, err := executor().Reconcile()
		if err != nil {
			t.Fatal(err)
		}
		got := commits(t, f.a.db) - before
		t.Logf("%s: %d segments, %d records scheduled, %d markers cleared: %d write transactions", what, rep.Segments, rep.Scheduled, rep.Unrelayed, got)
		if rep.Segments != n || rep.Scheduled != wantScheduled || rep.Unrelayed != wantUnrelayed || got != wantCommits {
			t.Fatalf("%s: %+v in %d commits; want %d scheduled, %d unrelayed in %d commits", what, rep, got, wantScheduled, wantUnrelayed, wantCommits)
		}
	}
	// c joined known_peers: per batch one transaction of records and
	// cleared markers (two, one each, before they shared it).
	reconcile("peer added", n, n, batches)
	reconcile("restart", 0, 0, 0)

	// The database was rebuilt: the index is back, the ledger is empty.
	if err := f.a.db.Update(func(tx *bolt.Tx) error {
		return tx.DeleteBucket([]byte("edge.ledger"))
	}); err != nil {
		t.Fatal(err)
	}
	led, err := ledger.Open(f.a.db)
	if err != nil {
		t.Fatal(err)
	}
	f.a.led = led
	reconcile("database rebuilt", 2*n, 0, batches)
	reconcile("restart", 0, 0, 0)
}

// reads is the number of read transactions started on db so far.
func reads(db *bolt.DB) int { return db.Stats().TxN }

// TestReconcileReadsPerBatch counts the read transactions start-up
// reconciliation opens: two per reconcileBatch segments and a few more,
// whatever the start (a plain restart, a peer added, the ledger rebuilt),
// not three per segment (a Stat and two Assurance reads each) plus one
// per recovery step: 130 here before, 7 or 8 now. Each read transaction
// allocates the transaction, its buckets and cursors anew and decodes
// the segment's records again: with 10,000 segments they were most of a
// plain restart's garbage, which the start-up GC target (25) turned
// into CPU time.
func TestReconcileReadsPerBatch(t *testing.T) {
	const batch, n, batches = 32, 40, 2
	f := newFixture(t, ack, ack)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var ids []string
	pairs := make([]ledger.Pair, n)
	for i := range n {
		id := fmt.Sprintf("s-%05d", i)
		ids = append(ids, id)
		f.a.put(t, id, []byte(id))
		mustSchedule(t, f.a.led, id, now.Add(-time.Hour), "b")
		pairs[i] = ledger.Pair{SegmentID: id, PeerID: "b"}
	}
	if _, err := f.a.led.ClaimBatch(pairs, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.led.AckBatch(pairs, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.store.MarkRelayedAll(ids); err != nil {
		t.Fatal(err)
	}
	// Fixed: the recovery steps' one scan of the records (one each, four,
	// before), the index page that comes back empty, and retention's scan. Per batch: the index page and
	// one read of the ledger. With records pending (c's, once scheduled):
	// one read of the index per ledger.HeldBatch of their segments.
	reconcile := func(what string, pending int) {
		t.Helper()
		ex := f.executor(t, func(c *Config) {
			c.Now = func() time.Time { return now }
			c.Retention = 7 * 24 * time.Hour
		})
		ex.reconcileBatch = batch
		before := reads(f.a.db)
		rep, err := ex.Reconcile()
		if err != nil {
			t.Fatal(err)
		}
		got, want := reads(f.a.db)-before, 1+1+1+2*batches+pending
		t.Logf("%s: %d segments, %d scheduled, %d unrelayed: %d read transactions", what, rep.Segments, rep.Scheduled, rep.Unrelayed, got)
		if rep.Segments != n || got > want {
			t.Errorf("%s: %d segments in %d read transactions; want %d segments in at most %d", what, rep.Segments, got, n, want)
		}
	}
	reconcile("peer added", 0) // c is in known_peers (newFixture), b alone acked
	reconcile("restart", 1)
	if err := f.a.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("edge.ledger")) }); err != nil {
		t.Fatal(err)
	}
	led, err := ledger.Open(f.a.db)
	if err != nil {
		t.Fatal(err)
	}
	f.a.led = led
	reconcile("database rebuilt", 0)
	reconcile("restart", 1)
}
