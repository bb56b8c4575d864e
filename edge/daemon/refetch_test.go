package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
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
			if !strings.Contains(metrics, `edged_storage_repairs_total{action="quarantined"} 1`) {
				t.Fatalf("metrics:\n%s", grepLines(metrics, "edged_storage_repairs_total"))
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
