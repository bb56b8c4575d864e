package daemon

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// TestHoldsNamesExactDigest: edged answers a QUERY with the segments it
// durably holds with exactly the queried size and digest. A segment it
// holds under the queried id but with other content is not named, and
// neither is one it lacks; its pipelined receiver also declines an offer
// it holds (ACK before any byte).
func TestHoldsNamesExactDigest(t *testing.T) {
	ctx := context.Background()
	dir, b, _ := receiverB(t)
	c := rawSenderVersion(t, dir, b, wire.Version2)
	content := []byte("held content")
	held := wire.Offer{SegmentID: "held", Size: int64(len(content)), SHA256: digest(content)}
	item := wire.Item{Offer: held, Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(content)), nil }}
	if r := c.DeliverWindow(ctx, []wire.Item{item}, 10*time.Second)[0]; r.Err != nil || !r.Sent {
		t.Fatalf("deliver: %+v", r)
	}
	other := held
	other.SHA256 = digest([]byte("other content"))
	missing := wire.Offer{SegmentID: "missing", Size: 1, SHA256: digest([]byte("x"))}
	got, mismatched, err := c.Query(ctx, []wire.Offer{held, missing})
	if err != nil || len(got) != 1 || got[0] != held || mismatched != 0 {
		t.Fatalf("query held+missing: %+v, %d, %v; want only held", got, mismatched, err)
	}
	got, mismatched, err = c.Query(ctx, []wire.Offer{other})
	if err != nil || len(got) != 0 || mismatched != 0 {
		t.Fatalf("query with another digest: %+v, %d, %v; want nothing named", got, mismatched, err)
	}
	// An offer of a held segment is declined with ACK, nothing sent.
	if r := c.DeliverWindow(ctx, []wire.Item{item}, 10*time.Second)[0]; r.Err != nil || r.Sent {
		t.Fatalf("offer of a held segment: %+v, want declined", r)
	}
	// An offer under the held id with other content is refused.
	bad := wire.Item{Offer: other, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("other content")), nil }}
	var ne *wire.NackError
	if r := c.DeliverWindow(ctx, []wire.Item{bad}, 10*time.Second)[0]; r.Sent || !asNack(r.Err, &ne) || ne.Nack.Code != wire.NackBadRequest {
		t.Fatalf("offer with another digest: %+v, want NACK bad_request before sending", r)
	}
}

func asNack(err error, ne **wire.NackError) bool {
	n, ok := err.(*wire.NackError)
	*ne = n
	return ok
}
