package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// TestDamagedAfterCleanStopCaughtOnSend: a segment whose content changed
// after a clean stop passes the start-up check (verify_on_start:
// unclean_stop hashes nothing after a clean stop), so the index vouched
// for it and a sent it whole; the receiver refused the checksum and the
// record went on failing. Now the read that sends it finds the damage: a
// quarantines it (reported on the storage RPC as found on read, counted
// in edged_storage_repairs_total, and wanted back), b never stores it,
// and its record for b ends deadlettered as a missing segment's does,
// while the undamaged segments are delivered.
func TestDamagedAfterCleanStopCaughtOnSend(t *testing.T) {
	for _, m := range storageModes {
		t.Run(m.name, func(t *testing.T) {
			cfg := newRepairNode(t, m.mod) // closed: clean stop
			path, off := segmentAt(t, cfg, "seg-2")
			overwrite(t, path, off+100, 4)

			dir := filepath.Dir(cfg.TLS.CA)
			aRelay, aRPC, bRelay, bRPC := listen(t), listen(t), listen(t), listen(t)
			bCfg := nodeConfig(t, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(), []config.Peer{{ID: "a", Address: aRelay.Addr().String()}})
			b := startNode(t, bCfg, bRelay, bRPC)
			cfg.Listen, cfg.RPC.Listen = aRelay.Addr().String(), aRPC.Addr().String()
			cfg.KnownPeers = []config.Peer{{ID: "b", Address: bRelay.Addr().String()}}
			a := startNode(t, cfg, aRelay, aRPC)

			waitUntil(t, "b stores seg-1 and seg-3", func() bool { return stored(b, "seg-1") && stored(b, "seg-3") })
			waitUntil(t, "seg-2's record deadlettered", func() bool {
				r, err := a.d.led.Get("seg-2", "b")
				return err == nil && r.State == ledger.StateDeadletter
			})
			if stored(b, "seg-2") {
				t.Fatal("b stored the damaged seg-2")
			}
			st, err := a.client.Storage(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.PreviousStop != stopClean || len(st.Quarantined) != 1 || st.Quarantined[0].Segment != "seg-2" ||
				st.Quarantined[0].Found != segstore.FoundOnRead || len(st.Wanted) != 1 || st.Wanted[0].Segment != "seg-2" {
				t.Fatalf("storage RPC: %+v", st)
			}
			if stored(a, "seg-2") {
				t.Fatal("a still indexes the damaged seg-2")
			}
			metrics, err := a.client.Metrics(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(metrics, `edged_storage_repairs_total{action="quarantined"} 1`) ||
				!strings.Contains(metrics, "edged_storage_lost_segments 1") {
				t.Fatalf("metrics:\n%s", grepLines(metrics, "edged_storage_"))
			}
		})
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// damageStored flips bytes of n's stored copy of id and reads it, as a
// send would: the read finds the damage and quarantines it.
func damageStored(t *testing.T, n *testNode, id string) {
	t.Helper()
	path, off, err := n.d.store.Where(id)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, path, off+8, 4)
	r, _, err := n.d.store.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, r)
	r.Close()
	if !errors.Is(err, segstore.ErrDamaged) {
		t.Fatalf("read of the damaged copy: %v", err)
	}
	if stored(n, id) {
		t.Fatalf("%s: %s still indexed", n.id, id)
	}
}

// TestOperatorResend: b acknowledged seg-1 and then lost it (damaged,
// quarantined): a's record says acked, so nothing sent it again.
// edgectl relay resend on a sends it again; b stores a good copy and no
// longer wants it. Without a stored segment or a known peer the request
// is refused (404), without both ids it is malformed (400).
func TestOperatorResend(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	nodes := startCluster(t, dir, []string{"a", "b"}, func(c *config.Config) { c.Relay.MaxProtocolVersion = wire.Version2 })
	a, b := nodes["a"], nodes["b"]
	content := bytes.Repeat([]byte("resend me "), 700)
	put(t, a, "seg-1", content)
	waitUntil(t, "a's record acked", func() bool {
		r, err := a.d.led.Get("seg-1", "b")
		return err == nil && r.State == ledger.StateAcked
	})
	damageStored(t, b, "seg-1")
	if w, _ := b.d.store.Wanted(); len(w) != 1 || w[0].Source != "a" {
		t.Fatalf("b wants %+v", w)
	}

	ctx := context.Background()
	for _, c := range []struct {
		req    rpc.ResendRequest
		status int
	}{
		{rpc.ResendRequest{Segment: "seg-1"}, 400},
		{rpc.ResendRequest{Segment: "nope", Peer: "b"}, 404},
		{rpc.ResendRequest{Segment: "seg-1", Peer: "zed"}, 404},
	} {
		var re *rpc.Error
		if _, err := a.client.Resend(ctx, c.req); !errors.As(err, &re) || re.Status != c.status {
			t.Errorf("Resend(%+v) = %v, want status %d", c.req, err, c.status)
		}
	}
	got, err := a.client.Resend(ctx, rpc.ResendRequest{Segment: "seg-1", Peer: "b"})
	if err != nil || !got.Resent || got.Record.Attempts != 1 {
		t.Fatalf("Resend = %+v, %v", got, err)
	}
	waitUntil(t, "b stores seg-1 again", func() bool { return stored(b, "seg-1") })
	if err := b.d.store.Verify("seg-1"); err != nil {
		t.Fatal(err)
	}
	// The want ends right after the commit that indexes the copy.
	waitUntil(t, "b no longer wants seg-1", func() bool {
		w, err := b.d.store.Wanted()
		return err == nil && len(w) == 0
	})
	waitUntil(t, "a's record acked again", func() bool {
		r, err := a.d.led.Get("seg-1", "b")
		return err == nil && r.State == ledger.StateAcked && r.Attempts == 2
	})
}

// TestLostSegmentRefetched: a node that loses a segment it acknowledged
// gets a good copy back by itself (wire version 3, WANT): b, which got
// seg-1 from a, asks a, its source; then a, which loses its own copy,
// asks b, which a had delivered it to (b's record for a is created, since
// a was the source). Each copy that comes back verifies and ends the
// want; a's record for b stays acked.
func TestLostSegmentRefetched(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	nodes := startCluster(t, dir, []string{"a", "b"}, nil)
	a, b := nodes["a"], nodes["b"]
	content := bytes.Repeat([]byte("lost and found "), 900)
	put(t, a, "seg-1", content)
	waitUntil(t, "a's record acked", func() bool {
		r, err := a.d.led.Get("seg-1", "b")
		return err == nil && r.State == ledger.StateAcked
	})
	for _, lost := range []*testNode{b, a} {
		damageStored(t, lost, "seg-1")
		waitUntil(t, lost.id+" stores seg-1 again", func() bool { return stored(lost, "seg-1") })
		if err := lost.d.store.Verify("seg-1"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, lost.id+" no longer wants seg-1", func() bool {
			w, err := lost.d.store.Wanted()
			return err == nil && len(w) == 0
		})
	}
	if e, err := a.d.store.Stat("seg-1"); err != nil || e.SHA256 != digest(content) {
		t.Fatalf("a's seg-1: %+v, %v", e, err)
	}
}

// TestScrubFindsUnreadDamage: a copy that nothing reads to send (its only
// peer is unreachable, so it never leaves) was vouched for by the index
// however damaged; the scrub reads it back and quarantines it, and it is
// then wanted back.
func TestScrubFindsUnreadDamage(t *testing.T) {
	for _, m := range storageModes {
		t.Run(m.name, func(t *testing.T) {
			cfg := newRepairNode(t, m.mod) // b never reachable: nothing is sent
			path, off := segmentAt(t, cfg, "seg-3")
			overwrite(t, path, off+100, 4)
			cfg.Storage.ScrubInterval, cfg.Storage.ScrubRate = 10*time.Millisecond, 1<<30
			relayLn, rpcLn := listen(t), listen(t)
			a := startNode(t, cfg, relayLn, rpcLn)
			waitUntil(t, "seg-3 quarantined", func() bool {
				st, err := a.client.Storage(context.Background())
				return err == nil && len(st.Quarantined) == 1 && st.Quarantined[0].Segment == "seg-3" && len(st.Wanted) == 1
			})
			for _, id := range []string{"seg-1", "seg-2"} {
				if !stored(a, id) {
					t.Errorf("%s, undamaged, is gone", id)
				}
			}
		})
	}
}

// TestLostSegmentAskedOfPeersStillOwed: a's record for b is not acked
// (here b is unreachable, so it failed; in TestLostSegmentRefetched it
// was a resend whose attempt read a's damaged copy), yet b is whom a
// must ask for a copy it loses: asking only acked peers left the segment
// lost for good when the record had been acked and then made due again.
func TestLostSegmentAskedOfPeersStillOwed(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	gone := listen(t)
	bAddr := gone.Addr().String()
	gone.Close() // b refuses every dial
	relayLn, rpcLn := listen(t), listen(t)
	a := startNode(t, nodeConfig(t, dir, "a", relayLn.Addr().String(), rpcLn.Addr().String(), []config.Peer{{ID: "b", Address: bAddr}}), relayLn, rpcLn)
	put(t, a, "seg-1", bytes.Repeat([]byte("owed "), 100))
	if r, err := a.d.led.Get("seg-1", "b"); err != nil || r.State == ledger.StateAcked {
		t.Fatalf("a's record for b: %+v, %v; want one not acked", r, err)
	}
	if got := a.d.holdersOf(segstore.Wanted{ID: "seg-1"}); len(got) != 1 || got[0] != "b" {
		t.Fatalf("holdersOf = %v, want [b]", got)
	}
}
