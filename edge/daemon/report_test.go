package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// TestPreviousStop: a brand-new store has no previous run (it was
// reported "unclean (crash, kill or power loss)"); a run that ended in
// Close leaves "clean", one that did not "unclean".
func TestPreviousStop(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	cfg := nodeConfig(t, dir, "a", "127.0.0.1:7400", "127.0.0.1:7401", []config.Peer{{ID: "b", Address: "127.0.0.1:9"}})
	open := func() string {
		t.Helper()
		d, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		st, err := (backend{d}).Storage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if st.PreviousStopClean != (st.PreviousStop == stopClean) {
			t.Fatalf("previous_stop %q, previous_stop_clean %v", st.PreviousStop, st.PreviousStopClean)
		}
		return st.PreviousStop
	}
	if got := open(); got != stopNone {
		t.Fatalf("first start: previous stop %q, want %q", got, stopNone)
	}
	if got := open(); got != stopClean {
		t.Fatalf("after Close: previous stop %q, want %q", got, stopClean)
	}
	if err := os.Remove(filepath.Join(cfg.Storage.Dir, CleanStopFile)); err != nil {
		t.Fatal(err)
	}
	if got := open(); got != stopUnclean {
		t.Fatalf("without the marker: previous stop %q, want %q", got, stopUnclean)
	}
}

// TestQuotaReplyIsFlat: GET /v1/quota answers the usage fields at the top
// level (what edgectl and scripts read since the route exists), not under
// "usage" as status and storage nest them; docs/edge.md says so.
func TestQuotaReplyIsFlat(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	nodes := startCluster(t, dir, []string{"a", "b"}, nil)
	resp, err := http.Get("http://" + nodes["a"].cfg.RPC.Listen + "/v1/quota")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"bytes", "segments", "reserved_bytes", "reserved_segments", "quota_bytes", "quota_segments",
		"max_segment_bytes", "free_bytes", "free_segments"} {
		if _, ok := got[k]; !ok {
			t.Errorf("GET /v1/quota: no top-level %q in %v", k, got)
		}
	}
	if _, ok := got["usage"]; ok {
		t.Errorf("GET /v1/quota nests usage: %v", got)
	}
}

// TestStoredLogLevel: a receiver logs each stored segment the same way
// whichever protocol version brought it (version 1 logged "segment
// stored" at info, version 2 at debug): at debug, so that a stream of
// small segments does not flood journald at the default level; the count
// is edged_inbound_segments_total.
func TestStoredLogLevel(t *testing.T) {
	for _, version := range []int{1, 2} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			dir := pkitest.New(t, "a", "b")
			aRelay, aRPC, bRelay, bRPC := listen(t), listen(t), listen(t), listen(t)
			info, debug := &logBuffer{}, &logBuffer{}
			bCfg := nodeConfig(t, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(), []config.Peer{{ID: "a", Address: aRelay.Addr().String()}})
			aCfg := nodeConfig(t, dir, "a", aRelay.Addr().String(), aRPC.Addr().String(), []config.Peer{{ID: "b", Address: bRelay.Addr().String()}})
			aCfg.Relay.MaxProtocolVersion, bCfg.Relay.MaxProtocolVersion = version, version
			b := startNode(t, bCfg, bRelay, bRPC, func(o *Options) {
				o.Log = slog.New(slog.NewMultiHandler(
					slog.NewTextHandler(info, &slog.HandlerOptions{Level: slog.LevelInfo}),
					slog.NewTextHandler(debug, &slog.HandlerOptions{Level: slog.LevelDebug})))
			})
			a := startNode(t, aCfg, aRelay, aRPC)
			put(t, a, "seg-1", []byte("hello"))
			waitUntil(t, "b stores seg-1", func() bool { return stored(b, "seg-1") })
			waitUntil(t, "b logs seg-1", func() bool { return strings.Contains(debug.String(), "segment stored") })
			b.stop()
			if strings.Contains(info.String(), "segment stored") {
				t.Errorf("version %d: segment stored logged at info:\n%s", version, info.String())
			}
		})
	}
}
