package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// stallReceiver starts node b knowing a and c (never dialled: b has
// nothing to send), with the relay connections' idle timeout cut to idle
// and the configuration changed by mod; it logs warnings into the
// returned buffer.
func stallReceiver(t *testing.T, idle time.Duration, mod func(*config.Config)) (string, *testNode, *logBuffer) {
	dir := pkitest.New(t, "a", "b", "c")
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "b", relayLn.Addr().String(), rpcLn.Addr().String(),
		[]config.Peer{{ID: "a", Address: "127.0.0.1:1"}, {ID: "c", Address: "127.0.0.1:1"}})
	if mod != nil {
		mod(cfg)
	}
	logs := &logBuffer{}
	b := startNode(t, cfg, relayLn, rpcLn, func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		o.IdleTimeout = idle
	})
	return dir, b, logs
}

// rawPeer dials to as node id and speaks the wire protocol directly.
func rawPeer(t *testing.T, pkiDir, id string, to *testNode, version int) *wire.Conn {
	t.Helper()
	tr, err := transport.New(transport.Config{
		NodeID: id, CertFile: filepath.Join(pkiDir, id+".crt"), KeyFile: filepath.Join(pkiDir, id+".key"),
		CAFile: filepath.Join(pkiDir, pki.CACertFile), AllowPeer: func(string) bool { return true },
		Wire: wire.Options{Version: version},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.Dial(context.Background(), to.cfg.Listen, to.id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// reply reads the receiver's next control frame on a version 2
// connection.
func reply(t *testing.T, c *wire.Conn) wire.Frame {
	t.Helper()
	f, err := wire.ReadFrame(c.NetConn(), wire.MaxControlPayload)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	return f
}

// offerV2 sends an OFFER on a version 2 connection and returns the reply.
func offerV2(t *testing.T, c *wire.Conn, o wire.Offer) wire.Frame {
	t.Helper()
	if err := c.SendOffer(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	return reply(t, c)
}

// TestStalledSegmentIsAborted (issue 20, item 9): a peer that stops
// sending in the middle of a SEGMENT, keeping its connection open, runs
// into the idle timeout. That is the peer's failure: b counts the receive
// as aborted, sends no NACK (it answered NACK internal and counted it
// refused, blaming itself), stores nothing and frees the reservation. In
// both protocol versions.
func TestStalledSegmentIsAborted(t *testing.T) {
	for _, version := range []int{wire.Version1, wire.Version2} {
		t.Run("v"+string(rune('0'+version)), func(t *testing.T) {
			dir, b, logs := stallReceiver(t, 200*time.Millisecond, nil)
			ctx := context.Background()
			c := rawPeer(t, dir, "a", b, version)
			content := bytes.Repeat([]byte("s"), 100<<10)
			o := offer("stalled", content)
			if version == wire.Version1 {
				if err := c.SendOffer(ctx, o); err != nil {
					t.Fatal(err)
				}
			} else if f := offerV2(t, c, o); f.Type != wire.TypeAccept {
				t.Fatalf("offer answered %s, want ACCEPT", f.Type)
			}
			if _, err := c.NetConn().Write(append(header(wire.TypeSegment, uint32(len(content))), content[:1000]...)); err != nil {
				t.Fatal(err)
			}
			// Nothing more is sent. b closes the connection without a word.
			if f, err := wire.ReadFrame(c.NetConn(), wire.MaxControlPayload); err == nil {
				t.Fatalf("b answered a stalled segment with %s %q, want the connection closed", f.Type, f.Payload)
			}
			waitUntil(t, "stalled receive counted as aborted", func() bool {
				return testMetric(b, `edged_inbound_segments_total{result="aborted"} 1`)
			})
			m, err := b.client.Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(m, "edged_nacks_sent_total{") || strings.Contains(m, `result="refused"`) {
				t.Errorf("a stalled sender was NACKed or counted as refused:\n%s", m)
			}
			if !strings.Contains(logs.String(), `msg="peer stalled the segment`) {
				t.Errorf("log lacks the stall:\n%s", logs.String())
			}
			waitUntil(t, "reservation released", func() bool {
				q, err := b.client.Quota(ctx)
				return err == nil && q.ReservedBytes == 0 && q.ReservedSegments == 0
			})
			if stored(b, "stalled") {
				t.Fatal("a stalled segment was stored")
			}
		})
	}
}

// TestTrickledSegmentCutOff (issue 20, item 2): a peer that keeps a
// SEGMENT alive with a byte every 20 ms (never idle for the 500 ms idle
// timeout) but far below relay.inbound_min_rate is cut off at the
// segment's deadline (idle timeout + size / min rate = 1.5 s for 1 KiB at
// 1 KiB/s), and its reservation freed; the idle timeout alone let it
// hold the reservation until the last byte, 20 s later, and then stored
// it.
func TestTrickledSegmentCutOff(t *testing.T) {
	dir, b, logs := stallReceiver(t, 500*time.Millisecond, func(c *config.Config) { c.Relay.InboundMinRate = 1 << 10 })
	ctx := context.Background()
	c := rawPeer(t, dir, "a", b, wire.Version2)
	content := bytes.Repeat([]byte("t"), 1<<10)
	o := offer("trickled", content)
	if f := offerV2(t, c, o); f.Type != wire.TypeAccept {
		t.Fatalf("offer answered %s, want ACCEPT", f.Type)
	}
	if _, err := c.NetConn().Write(header(wire.TypeSegment, uint32(len(content)))); err != nil {
		t.Fatal(err)
	}
	sent := 0
	for ; sent < len(content); sent++ {
		if _, err := c.NetConn().Write(content[sent : sent+1]); err != nil {
			break // b closed the connection
		}
		time.Sleep(20 * time.Millisecond) // the trickle's pace, not a wait for b
	}
	if sent == len(content) {
		if f, err := wire.ReadFrame(c.NetConn(), wire.MaxControlPayload); err == nil {
			t.Fatalf("a segment sent at 50 B/s was answered %s, want it cut off", f.Type)
		}
	}
	waitUntil(t, "trickled receive counted as aborted", func() bool {
		return testMetric(b, `edged_inbound_segments_total{result="aborted"} 1`)
	})
	if stored(b, "trickled") {
		t.Fatal("the trickled segment was stored")
	}
	waitUntil(t, "reservation released", func() bool {
		q, err := b.client.Quota(ctx)
		return err == nil && q.ReservedBytes == 0
	})
	if !strings.Contains(logs.String(), "slower than relay.inbound_min_rate") {
		t.Errorf("log lacks the stall:\n%s", logs.String())
	}
	t.Logf("cut off after %d of %d bytes", sent, len(content))
}

// TestPeerReserveShare (issue 20, item 2): one peer's accepted offers may
// reserve at most storage.peer_reserve_percent of the quota (never less
// than the largest segment); beyond it b answers NACK quota, while
// another peer's offers are still accepted, and the share frees once the
// peer's segments are stored. Before, a peer could reserve the whole
// quota with offers whose segments it never sent.
func TestPeerReserveShare(t *testing.T) {
	dir, b, _ := stallReceiver(t, time.Minute, func(c *config.Config) {
		c.Storage.QuotaBytes, c.Storage.MaxSegmentBytes, c.Storage.PeerReservePercent = 8000, 1000, 25 // 2000 bytes each
	})
	a := rawPeer(t, dir, "a", b, wire.Version2)
	seg := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 900) }
	for i := range 2 {
		if f := offerV2(t, a, offer("a"+string(rune('0'+i)), seg(i))); f.Type != wire.TypeAccept {
			t.Fatalf("a's offer %d answered %s, want ACCEPT", i, f.Type)
		}
	}
	f := offerV2(t, a, offer("a2", seg(2)))
	n, err := wire.DecodeNack(f.Payload)
	if f.Type != wire.TypeNack || err != nil || n.Code != wire.NackQuota {
		t.Fatalf("a's third offer (2700 of a 2000-byte share) answered %s %q, want NACK quota", f.Type, f.Payload)
	}
	if !strings.Contains(n.Message, "share") {
		t.Errorf("NACK message %q does not say the peer's share is taken", n.Message)
	}
	// The quota has room for c: its offers are not held up by a's.
	c := rawPeer(t, dir, "c", b, wire.Version2)
	for i := range 2 {
		if f := offerV2(t, c, offer("c"+string(rune('0'+i)), seg(10+i))); f.Type != wire.TypeAccept {
			t.Fatalf("c's offer %d answered %s, want ACCEPT", i, f.Type)
		}
	}
	// a sends one of its accepted segments: stored, and its share has
	// room for the refused one again.
	if err := wire.WriteFrame(a.NetConn(), wire.TypeSegment, seg(0)); err != nil {
		t.Fatal(err)
	}
	if f := reply(t, a); f.Type != wire.TypeAck {
		t.Fatalf("a0 answered %s, want ACK", f.Type)
	}
	if f := offerV2(t, a, offer("a2", seg(2))); f.Type != wire.TypeAccept {
		t.Fatalf("a's offer after one of its segments was stored answered %s %q, want ACCEPT", f.Type, f.Payload)
	}
}

// TestPeerShareAndDeadlineDefaults: what the defaults give (quoted in
// docs/edge-config.md): a 256 MiB, 2,500-segment share per peer of the
// 1 GiB, 10,000-segment quota; a share never below one maximal segment;
// and a 64 MiB segment's transfer bounded at 1 min + 64 MiB at 16 KiB/s.
func TestPeerShareAndDeadlineDefaults(t *testing.T) {
	cfg := config.Default()
	if b, n := peerShare(cfg); b != 256<<20 || n != 2500 {
		t.Fatalf("default share %d bytes, %d segments; want 256 MiB, 2500", b, n)
	}
	cfg.Storage.QuotaBytes, cfg.Storage.MaxSegmentBytes, cfg.Storage.QuotaSegments = 16<<20, 16<<20, 3
	if b, n := peerShare(cfg); b != 16<<20 || n != 1 {
		t.Fatalf("small store's share %d bytes, %d segments; want one maximal segment", b, n)
	}
	d := &Daemon{cfg: config.Default()}
	ctx, cancel := d.segmentContext(context.Background(), 64<<20)
	defer cancel()
	dl, _ := ctx.Deadline()
	if got, want := time.Until(dl).Round(time.Minute), 69*time.Minute; got != want {
		t.Fatalf("64 MiB deadline in %v, want %v", got, want)
	}
}

// TestAcceptedOfferNeverSent: a version 2 peer whose accepted offer's
// SEGMENT never comes (it goes quiet after the ACCEPT) has its
// connection closed by the idle timeout; the offer counts as aborted
// (it was counted nowhere) and its reservation is freed.
func TestAcceptedOfferNeverSent(t *testing.T) {
	dir, b, _ := stallReceiver(t, 200*time.Millisecond, nil)
	c := rawPeer(t, dir, "a", b, wire.Version2)
	if f := offerV2(t, c, offer("never", []byte("never sent"))); f.Type != wire.TypeAccept {
		t.Fatalf("offer answered %s, want ACCEPT", f.Type)
	}
	if f, err := wire.ReadFrame(c.NetConn(), wire.MaxControlPayload); err == nil {
		t.Fatalf("b sent %s to a quiet peer, want the connection closed", f.Type)
	}
	waitUntil(t, "the unsent offer counted as aborted", func() bool {
		return testMetric(b, `edged_inbound_segments_total{result="aborted"} 1`)
	})
	waitUntil(t, "reservation released", func() bool {
		q, err := b.client.Quota(context.Background())
		return err == nil && q.ReservedBytes == 0 && q.ReservedSegments == 0
	})
}
