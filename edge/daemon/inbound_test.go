package daemon

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// TestInboundOnlyPeer: sensor s has no address anyone could dial. b lists
// it in accept_from, so b accepts what s sends over mutual TLS, stores it
// and relays it to its known peer c, and owes s nothing: no ledger record,
// no dial circuit, not a required peer. x, in neither list, is refused.
func TestInboundOnlyPeer(t *testing.T) {
	dir := pkitest.New(t, "s", "b", "c", "x")
	ctx := context.Background()
	relayLns, rpcLns := map[string]net.Listener{}, map[string]net.Listener{}
	for _, id := range []string{"s", "b", "c", "x"} {
		relayLns[id], rpcLns[id] = listen(t), listen(t)
	}
	start := func(id string, peers []string, acceptFrom ...string) *testNode {
		var ps []config.Peer
		for _, p := range peers {
			ps = append(ps, config.Peer{ID: p, Address: relayLns[p].Addr().String()})
		}
		cfg := nodeConfig(t, dir, id, relayLns[id].Addr().String(), rpcLns[id].Addr().String(), ps)
		cfg.AcceptFrom = acceptFrom
		return startNode(t, cfg, relayLns[id], rpcLns[id])
	}
	c := start("c", []string{"b"})
	b := start("b", []string{"c"}, "s")
	s := start("s", []string{"b"})
	x := start("x", []string{"b"})

	put(t, s, "reading-1", []byte("21.5 C"))
	waitUntil(t, "s's segment relayed by b", func() bool { return assured(b, "reading-1") })
	waitUntil(t, "c stores it", func() bool { return stored(c, "reading-1") })
	if src := source(t, b, "reading-1"); src != "s" {
		t.Fatalf("b recorded source %q, want s", src)
	}
	a, err := b.client.Assurance(ctx, "reading-1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.RequiredPeers, []string{"c"}) || len(a.Records) != 1 || a.Records[0].Peer != "c" {
		t.Fatalf("b owes reading-1 to %v (records %+v), want c only", a.RequiredPeers, a.Records)
	}
	st, err := b.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Peers) != 1 || st.Peers[0].ID != "c" || !slices.Equal(st.AcceptFrom, []string{"s"}) {
		t.Fatalf("b status peers %+v accept_from %v; want circuit for c only, accepting from s", st.Peers, st.AcceptFrom)
	}
	if !testMetric(b, `edged_inbound_segments_total{result="stored"} 1`) {
		t.Error("b did not count s's segment as stored")
	}

	// x is in neither list: its handshake is refused and its record fails.
	put(t, x, "intruder", []byte("x"))
	waitUntil(t, "x refused", func() bool {
		m, err := b.client.Metrics(ctx)
		return err == nil && strings.Contains(m, "\nedged_inbound_connections_rejected_total ") &&
			!strings.Contains(m, "\nedged_inbound_connections_rejected_total 0\n")
	})
	if stored(b, "intruder") {
		t.Fatal("b stored a segment from x, which it does not accept")
	}
}
