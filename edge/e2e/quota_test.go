package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// metricValue reads one sample (name with its labels, as printed) of n's
// metrics; 0 when absent.
func metricValue(t *testing.T, n *node, sample string) int {
	t.Helper()
	m, err := n.client.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return int(x)
		}
	}
	return 0
}

// TestQuotaRefusalsKeepBudget: a receiver that stays full refuses offer
// after offer with NACK quota, ten times the sender's max_retries of them;
// the sender deadletters nothing and counts the refusals as postponed,
// not failed, and once the receiver has room everything arrives.
func TestQuotaRefusalsKeepBudget(t *testing.T) {
	t.Parallel()
	const owed = 4
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	b.storage = "  quota_bytes: 10KiB\n  max_segment_bytes: 8KiB\n"
	a.relay = "  max_retries: 2\n  backoff: {initial: 50ms, max: 200ms}\n  ack_timeout: 10s\n  dial_timeout: 2s\n"
	b.start()
	a.start()
	putFile(t, a, "first", bytes.Repeat([]byte("1"), 6<<10))
	eventually(t, "first acked", a.inState("first", "b", "acked"))
	for i := range owed {
		putFile(t, a, fmt.Sprintf("more-%d", i), bytes.Repeat([]byte{byte('a' + i)}, 6<<10))
	}
	const refusals = 10 * 2
	eventually(t, fmt.Sprintf("b refuses %d offers for want of room (or a deadletters)", refusals), func() bool {
		return metricValue(t, b, `edged_nacks_sent_total{code="quota"}`) >= refusals ||
			metricValue(t, a, `edged_ledger_records{state="deadletter"}`) > 0
	})
	rs, err := a.client.Records(context.Background(), "all")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs.Records {
		if r.State == "deadletter" {
			t.Errorf("deadlettered for want of room alone: %+v", r)
		}
	}
	if st, err := a.client.Status(context.Background()); err != nil || len(st.Peers) != 1 || st.Peers[0].Room == "closed" || st.Peers[0].RoomRefusals == 0 {
		t.Errorf("a's status while b is full: %+v (%v); want b's room circuit open or half-open", st.Peers, err)
	}
	if out := edgectl(t, a.rpc, "status"); !strings.Contains(out, "full (") {
		t.Errorf("edgectl status does not say b is full:\n%s", out)
	}
	if closed := metricValue(t, a, `edged_peer_room_state{peer="b",state="closed"}`); closed != 0 {
		t.Errorf("edged_peer_room_state says b's room circuit is closed while it refuses")
	}
	postponed := metricValue(t, a, `edged_relay_attempts_total{outcome="postponed",peer="b"}`)
	failed := metricValue(t, a, `edged_relay_attempts_total{outcome="failed",peer="b"}`)
	t.Logf("b refused %d offers; a counted %d postponed, %d failed", metricValue(t, b, `edged_nacks_sent_total{code="quota"}`), postponed, failed)
	if postponed < refusals || failed != 0 {
		t.Errorf("a counted %d postponed and %d failed attempts, want ≥ %d postponed and none failed", postponed, failed, refusals)
	}

	// a stops first: with max_retries 2, dials refused while b restarts
	// would spend a's budget and deadletter the records (a failed dial is
	// a failed attempt; only want of room is not), which is not what this
	// test is about. a's restart puts its deferrals back (reconciliation).
	a.stop()
	b.stop()
	b.storage = "  quota_bytes: 1MiB\n  max_segment_bytes: 8KiB\n"
	b.start()
	a.start()
	for i := range owed {
		eventually(t, fmt.Sprintf("more-%d acked once b has room", i), a.inState(fmt.Sprintf("more-%d", i), "b", "acked"))
	}
	if st, err := a.client.Status(context.Background()); err != nil || st.Peers[0].Room != "closed" {
		t.Errorf("a's status after b had room again: %+v (%v)", st.Peers, err)
	}
	if out := edgectl(t, a.rpc, "status"); strings.Contains(out, "full (") {
		t.Errorf("edgectl status still says b is full:\n%s", out)
	}
}
