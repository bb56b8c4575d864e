package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// TestStalledPeerHoldsOnlyItsShare (issue 20, item 2): c, a configured
// peer of b, offers four 2 MiB segments, enough for b's whole 8 MiB
// quota, and then sends the first one a byte at a time, never idle long
// enough for b's idle timeout. b accepts only c's share
// (storage.peer_reserve_percent, 25 %: one 2 MiB segment) and refuses the
// rest with NACK quota; a, another peer, meanwhile delivers all its
// segments to b. Before the share, c's four accepted offers held the
// whole quota for as long as it trickled, and every offer of a was
// refused quota.
func TestStalledPeerHoldsOnlyItsShare(t *testing.T) {
	t.Parallel()
	cl := newCluster(t, "a", "b", "c") // c runs no edged: the test speaks for it
	a, b := cl.nodes["a"], cl.nodes["b"]
	b.storage = "  quota_bytes: 8MiB\n  max_segment_bytes: 2MiB\n"
	b.start()

	tr, err := transport.New(transport.Config{
		NodeID: "c", CertFile: filepath.Join(cl.dir, "pki", "c.crt"), KeyFile: filepath.Join(cl.dir, "pki", "c.key"),
		CAFile: filepath.Join(cl.dir, "pki", pki.CACertFile), AllowPeer: func(string) bool { return true },
		Wire: wire.Options{Version: wire.Version2},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := tr.Dial(ctx, b.listen, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const size = 2 << 20
	var accepted, refused int
	for i := range 4 {
		content := bytes.Repeat([]byte{byte(i)}, size)
		if err := conn.SendOffer(ctx, wire.Offer{SegmentID: fmt.Sprintf("c-%d", i), Size: size, SHA256: digest(content)}); err != nil {
			t.Fatal(err)
		}
		f, err := wire.ReadFrame(conn.NetConn(), wire.MaxControlPayload)
		if err != nil {
			t.Fatal(err)
		}
		switch n, _ := wire.DecodeNack(f.Payload); {
		case f.Type == wire.TypeAccept:
			accepted++
		case f.Type == wire.TypeNack && n.Code == wire.NackQuota:
			refused++
		default:
			t.Fatalf("c's offer %d answered %s %q", i, f.Type, f.Payload)
		}
	}
	// The first accepted segment's bytes, one every 200 ms: b's idle
	// timeout (one minute) never fires, and at this pace the segment's
	// own deadline is minutes away.
	hdr := binary.BigEndian.AppendUint32([]byte{byte(wire.TypeSegment)}, size)
	if _, err := conn.NetConn().Write(hdr); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var trickle sync.WaitGroup
	var trickleErr error
	trickle.Add(1)
	go func() {
		defer trickle.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.NetConn().Write([]byte{0}); err != nil {
				trickleErr = err
				return
			}
		}
	}()

	a.start()
	const segments = 10
	for i := range segments {
		content := bytes.Repeat([]byte{byte(i)}, 100<<10+i)
		if _, err := a.client.PutSegment(ctx, fmt.Sprintf("a-%02d", i), int64(len(content)), digest(content), bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range segments {
		id := fmt.Sprintf("a-%02d", i)
		eventually(t, "b acked "+id+" while c stalls", a.inState(id, "b", "acked"))
	}
	close(stop)
	trickle.Wait()
	if trickleErr != nil {
		t.Fatalf("c's trickle ended before a delivered (b closed it: %v); the test proves nothing", trickleErr)
	}
	if accepted != 1 || refused != 3 {
		t.Errorf("c's offers: %d accepted, %d refused quota; want 1 and 3 (a 2 MiB share of 8 MiB)", accepted, refused)
	}
	q, err := b.client.Quota(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if q.ReservedBytes != size {
		t.Errorf("b holds %d bytes reserved, want c's one stalled segment (%d)", q.ReservedBytes, size)
	}
}
