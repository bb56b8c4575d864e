package e2e

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// bigSegments are large enough that a transfer is still running when the
// test sees the receiver's reservation and kills a process.
func bigSegments(n, size int) map[string][]byte {
	out := map[string][]byte{}
	for i := range n {
		out[fmt.Sprintf("big-%d", i)] = bytes.Repeat([]byte(fmt.Sprintf("segment %d ", i)), size/10)
	}
	return out
}

// receiving reports whether n holds a reservation: a receive in progress.
func (n *node) receiving() bool {
	q, err := n.client.Quota(context.Background())
	return err == nil && q.ReservedBytes > 0
}

// settled checks after a crash and restart: every segment delivered with
// its digest, every record acked, nothing reserved or left half-written.
func settled(t *testing.T, a, b *node, segs map[string][]byte) {
	t.Helper()
	for id, content := range segs {
		eventually(t, "a acked "+id, a.inState(id, "b", "acked"))
		if !b.has(id, digest(content)) {
			t.Errorf("b lacks %s with the right digest", id)
		}
	}
	a.ledgerConsistent(t)
	if q := ctlJSON[map[string]int64](t, b, "quota"); q["reserved_bytes"] != 0 || q["segments"] != int64(len(segs)) {
		t.Errorf("b quota after recovery: %v", q)
	}
	storeClean(t, b, segs)
	if disk := onDisk(t, b); len(disk.Segments) != len(segs) {
		t.Errorf("b holds %d segments on disk for %d", len(disk.Segments), len(segs))
	}
}

// TestKillSenderMidTransfer: kill -9 of the sender while b receives; on
// restart a's reconciliation turns the abandoned attempts into failures,
// resends, and every segment arrives exactly once in b's store.
func TestKillSenderMidTransfer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("large segments; skipped with -short")
	}
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	a.relay = "  backoff: {initial: 100ms, max: 200ms}\n  max_retries: 1000\n  dial_timeout: 1s\n"
	a.start()
	// Ingest the backlog while b is down, so the transfers run back to
	// back once it is up.
	segs := bigSegments(3, 24<<20)
	for id, content := range segs {
		putFile(t, a, id, content)
	}
	b.start()
	eventually(t, "b receiving", b.receiving)
	a.kill()
	a.start()
	if !regexp.MustCompile(`msg="ledger reconciled" .*abandoned_inflight=[1-9]`).MatchString(a.log()) {
		t.Error("restarted sender reported no abandoned in-flight attempt")
	}
	settled(t, a, b, segs)
}

// TestKillReceiverMidTransfer: kill -9 of the receiver mid-segment; its
// restart removes the half-written temp file, and the sender's retries
// deliver every segment once b is back.
func TestKillReceiverMidTransfer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("large segments; skipped with -short")
	}
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	a.relay = "  backoff: {initial: 100ms, max: 200ms}\n  max_retries: 1000\n  dial_timeout: 1s\n"
	a.start()
	segs := bigSegments(3, 24<<20)
	for id, content := range segs {
		putFile(t, a, id, content)
	}
	b.start()
	eventually(t, "b receiving", b.receiving)
	b.kill()
	eventually(t, "a saw a failed attempt", func() bool {
		rs, err := a.client.Records(context.Background(), "failed")
		return err == nil && len(rs.Records) > 0
	})
	b.start()
	settled(t, a, b, segs)
}

// TestEvictOnRelay: with all_peers the sender deletes its copy once both
// peers acknowledged; with one_peer only after the other peer's delivery
// finished too (here: deadlettered), never while it is pending.
func TestEvictOnRelay(t *testing.T) {
	t.Parallel()
	t.Run("all_peers", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, "a", "b", "c")
		a := c.nodes["a"]
		a.relay = "  evict_on_relay: true\n  success_condition: all_peers\n"
		for _, n := range c.nodes {
			n.start()
		}
		content := []byte("evict me after both")
		putFile(t, a, "ev", content)
		eventually(t, "evicted on a", func() bool { return len(a.index()) == 0 })
		for _, id := range []string{"b", "c"} {
			if !c.nodes[id].has("ev", digest(content)) {
				t.Errorf("%s lacks ev", id)
			}
			if r, _ := a.record("ev", id); r.State != "acked" {
				t.Errorf("evicted with %s in state %s", id, r.State)
			}
		}
		if q := ctlJSON[map[string]int64](t, a, "quota"); q["bytes"] != 0 || q["segments"] != 0 {
			t.Errorf("quota not freed: %v", q)
		}
		as := ctlJSON[map[string]any](t, a, "assurance", "ev")
		if as["stored"] != false || as["met"] != true {
			t.Errorf("assurance after eviction: %v", as)
		}
	})
	t.Run("one_peer", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, "a", "b", "c")
		a := c.nodes["a"]
		a.relay = "  evict_on_relay: true\n  success_condition: one_peer\n  max_retries: 3\n" +
			"  backoff: {initial: 500ms, max: 500ms}\n  dial_timeout: 1s\n"
		a.start()
		c.nodes["b"].start() // c stays down
		putFile(t, a, "ev", []byte("evict me after one, once c is settled"))
		// Every poll reads the index, then c's record: whenever the copy is
		// gone, c's delivery must already be over (deadlettered).
		sawPending := false
		eventually(t, "evicted on a", func() bool {
			stored := len(a.index()) == 1
			r, ok := a.record("ev", "c")
			if !stored && (!ok || r.State != "deadletter") {
				t.Fatalf("evicted while c's record is %+v", r)
			}
			sawPending = sawPending || (stored && ok && r.State != "deadletter")
			return !stored
		})
		if !sawPending {
			t.Log("never observed the pending window (slow machine); relying on the log order")
		}
		// The log gives the order of events regardless of timing. edged
		// writes "segment evicted on relay" after the eviction commits, so
		// the index can be empty a moment before the line is there (a
		// loaded make test caught it): wait for the line, then judge.
		eventually(t, "eviction logged", func() bool { return strings.Contains(a.log(), `msg="segment evicted on relay"`) })
		log := a.log()
		success := strings.Index(log, `msg="relay success"`)
		dead := regexp.MustCompile(`msg="relay deadlettered" .*peer=c`).FindStringIndex(log)
		evicted := strings.Index(log, `msg="segment evicted on relay"`)
		if success < 0 || dead == nil || evicted < 0 || !(success < dead[0] && dead[0] < evicted) {
			t.Fatalf("want relay success < c deadlettered < evicted in a's log; got %d, %v, %d", success, dead, evicted)
		}
	})
}
