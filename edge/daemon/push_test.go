package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relay-dev/relay/edge/wire"
)

// TestPushedSegments: edged's receiver takes a PUSH like an accepted
// OFFER when the segment is new (stored durably, then ACK), drops the
// bytes and answers ACK when it already holds the segment with that
// digest, and drops them and answers NACK when it refuses it (a bad
// digest, another segment under the same id); each time the connection
// stays in step, pushed and offered segments mixed in one window.
func TestPushedSegments(t *testing.T) {
	ctx := context.Background()
	dir, b, _ := receiverB(t)
	c := rawSenderVersion(t, dir, b, wire.Version2)
	pushed := func(id string, content []byte) wire.Item {
		return wire.Item{
			Offer: wire.Offer{SegmentID: id, Size: int64(len(content)), SHA256: digest(content)},
			Open:  func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(content)), nil },
			Push:  true,
		}
	}
	var items []wire.Item
	for i := range 12 {
		it := pushed(fmt.Sprintf("p%02d", i), bytes.Repeat([]byte{byte(i)}, 100+i))
		it.Push = i%3 != 0 // every third offered
		items = append(items, it)
	}
	for i, r := range c.DeliverWindow(ctx, items, 10*time.Second) {
		if r.Err != nil || !r.Sent {
			t.Fatalf("%s: %+v, want stored", items[i].Offer.SegmentID, r)
		}
		f, e, err := b.d.store.Open(items[i].Offer.SegmentID)
		if err != nil {
			t.Fatalf("%s acknowledged but not stored: %v", items[i].Offer.SegmentID, err)
		}
		got, _ := io.ReadAll(f)
		f.Close()
		if e.SHA256 != items[i].Offer.SHA256 || digest(got) != e.SHA256 {
			t.Fatalf("%s stored with other content", items[i].Offer.SegmentID)
		}
	}

	dup := b.d.met.inbound.WithLabelValues("duplicate")
	before := testutil.ToFloat64(dup)
	if r := c.DeliverWindow(ctx, items[1:2], 10*time.Second)[0]; r.Err != nil || !r.Sent {
		t.Fatalf("push of a held segment: %+v, want ACK", r)
	}
	if got := testutil.ToFloat64(dup) - before; got != 1 {
		t.Fatalf("duplicates counted: %v, want 1", got)
	}

	badDigest := pushed("bad", []byte("real content"))
	badDigest.Offer.SHA256 = digest([]byte("other content"))
	conflict := pushed("p01", []byte("other content under a held id"))
	after := pushed("after", []byte("still in step"))
	res := c.DeliverWindow(ctx, []wire.Item{badDigest, conflict, after}, 10*time.Second)
	var ne *wire.NackError
	if !asNack(res[0].Err, &ne) || ne.Nack.Code != wire.NackChecksum {
		t.Errorf("push with a wrong digest: %+v, want NACK checksum", res[0])
	}
	if !asNack(res[1].Err, &ne) || ne.Nack.Code != wire.NackBadRequest {
		t.Errorf("push of other content under a held id: %+v, want NACK bad_request", res[1])
	}
	if res[2].Err != nil || !res[2].Sent {
		t.Errorf("push after two refusals: %+v, want stored", res[2])
	}
	if _, _, err := b.d.store.Open("bad"); err == nil {
		t.Error("a segment with a wrong digest was stored")
	}
	if e, err := b.d.store.Stat("p01"); err != nil || e.SHA256 != items[1].Offer.SHA256 {
		t.Errorf("held p01 after a conflicting push: %+v, %v", e, err)
	}
}
