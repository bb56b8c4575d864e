package daemon

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
)

// TestCircuitObservable: a peer that refuses connections shows as an open
// dial circuit in the status RPC and in /metrics, and its deferred records
// are counted.
func TestCircuitObservable(t *testing.T) {
	dir := pkitest.New(t, "a", "z")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "a", relayLn.Addr().String(), rpcLn.Addr().String(), []config.Peer{{ID: "z", Address: deadAddr}})
	cfg.Relay.Workers = 1
	cfg.Relay.Backoff = config.Backoff{Initial: time.Hour, Max: time.Hour}
	a := startNode(t, cfg, relayLn, rpcLn)
	for _, id := range []string{"s-1", "s-2", "s-3"} {
		put(t, a, id, []byte(id))
	}
	waitUntil(t, "two records deferred", func() bool { return testMetric(a, `edged_relay_deferred_total{peer="z"} 2`) })
	st, err := a.client.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := st.Peers[0]
	if p.ID != "z" || p.Circuit != "open" || p.DialFailures != 1 || p.ReopenAt == nil || !strings.Contains(p.LastDialError, "refused") {
		t.Fatalf("status peer %+v; want z open after 1 failed dial, with the error", p)
	}
	for _, want := range []string{
		`edged_peer_circuit_state{peer="z",state="open"} 1`,
		`edged_peer_circuit_state{peer="z",state="closed"} 0`,
		`edged_peer_dials_total{peer="z",result="failed"} 1`,
		`edged_relay_attempts_total{outcome="failed",peer="z"} 1`,
	} {
		if !testMetric(a, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// An operator retry for the peer closes its circuit.
	if _, err := a.client.RetryDeadletter(context.Background(), rpc.Selector{Peer: "z"}); err != nil {
		t.Fatal(err)
	}
	if st, err = a.client.Status(context.Background()); err != nil || st.Peers[0].Circuit != "closed" {
		t.Fatalf("after deadletter retry --peer z: %+v, %v; want circuit closed", st.Peers, err)
	}
}

// TestDeadletterSelectors: retry and purge name the records they acted
// on; a peer or segment without ledger records is 404, not "0 records";
// an empty selector is 400, not "everything".
func TestDeadletterSelectors(t *testing.T) {
	dir := pkitest.New(t, "a", "z")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "a", relayLn.Addr().String(), rpcLn.Addr().String(), []config.Peer{{ID: "z", Address: deadAddr}})
	cfg.Relay.MaxRetries = 1
	a := startNode(t, cfg, relayLn, rpcLn)
	ctx := context.Background()
	for _, id := range []string{"s-1", "s-2"} {
		put(t, a, id, []byte(id))
	}
	waitUntil(t, "both deadlettered", func() bool {
		dl, err := a.client.Deadletter(ctx)
		return err == nil && len(dl.Records) == 2
	})
	for _, tc := range []struct {
		sel  rpc.Selector
		code int
	}{
		{rpc.Selector{}, 400},
		{rpc.Selector{Peer: "nobody"}, 404},
		{rpc.Selector{Segment: "nope"}, 404},
		{rpc.Selector{All: true, Peer: "z"}, 400},
	} {
		for name, op := range map[string]func(context.Context, rpc.Selector) (rpc.Deadlettered, error){
			"retry": a.client.RetryDeadletter, "purge": a.client.PurgeDeadletter,
		} {
			_, err := op(ctx, tc.sel)
			var re *rpc.Error
			if !errors.As(err, &re) || re.Status != tc.code {
				t.Errorf("%s %+v: %v, want HTTP %d", name, tc.sel, err, tc.code)
			}
		}
	}
	got, err := a.client.PurgeDeadletter(ctx, rpc.Selector{Segment: "s-2"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Count != 1 || len(got.Records) != 1 || got.Records[0].Segment != "s-2" || got.Records[0].Peer != "z" ||
		got.Records[0].State != "deadletter" || got.Records[0].LastError == "" {
		t.Fatalf("purge s-2 replied %+v; want the one record s-2/z as it was", got)
	}
	got, err = a.client.RetryDeadletter(ctx, rpc.Selector{Peer: "z"})
	if err != nil || got.Count != 1 || got.Records[0].Segment != "s-1" {
		t.Fatalf("retry z replied %+v, %v; want s-1/z", got, err)
	}
}
