package daemon

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/wire"
)

// gatedReader yields head, then blocks until gate closes, then yields
// tail: a copy of a segment that is still arriving.
type gatedReader struct {
	head, tail []byte
	gate       <-chan struct{}
}

func (r *gatedReader) Read(p []byte) (int, error) {
	if len(r.head) > 0 {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	<-r.gate
	if len(r.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.tail)
	r.tail = r.tail[n:]
	return n, nil
}

func (r *gatedReader) Close() error { return nil }

// firstCopyHalfSent offers b segment o from a raw sender as a, sends half
// of its bytes and holds the rest until release (idempotent); first
// yields that copy's result. It returns once b has reserved the copy.
func firstCopyHalfSent(t *testing.T, dir string, b *testNode, o wire.Offer, content []byte) (release func(), first <-chan wire.Result) {
	t.Helper()
	gate := make(chan struct{})
	var once sync.Once
	raw := rawSenderVersion(t, dir, b, wire.Version)
	res := make(chan wire.Result, 1)
	go func() {
		r := raw.DeliverWindow(context.Background(), []wire.Item{{Offer: o, Open: func() (io.ReadCloser, error) {
			return &gatedReader{head: content[:len(content)/2], tail: content[len(content)/2:], gate: gate}, nil
		}}}, time.Minute)
		res <- r[0]
	}()
	waitUntil(t, "the first copy reserved at b", func() bool {
		u, err := b.client.Quota(context.Background())
		return err == nil && u.ReservedSegments == 1
	})
	return func() { once.Do(func() { close(gate) }) }, res
}

// TestSameSegmentFromTwoSenders: two senders offer b the same segment at
// once. a's copy (a real TLS connection at wire version 5) is accepted
// and half sent, then held; meanwhile edged c relays the same segment to
// b, which refuses it while a's copy is arriving. That refusal is NACK
// busy, and c postpones the offer with its retry budget untouched, over
// more refusals than relay.max_retries allows; once a's copy is stored,
// c's next offer is acknowledged (already held). Before, the refusal was
// NACK internal, a failed attempt: c deadlettered the record after
// max_retries + 1 refusals though b went on to store the segment.
func TestSameSegmentFromTwoSenders(t *testing.T) {
	const maxRetries = 2
	dir := pkitest.New(t, "a", "b", "c")
	nodes := startCluster(t, dir, []string{"a", "b", "c"}, func(cfg *config.Config) {
		cfg.Relay.MaxRetries = maxRetries
	})
	b, c := nodes["b"], nodes["c"]
	ctx := context.Background()
	content := bytes.Repeat([]byte("the same segment "), 20000) // 340 kB: offered, not pushed
	o := offer("same", content)

	release, first := firstCopyHalfSent(t, dir, b, o, content)
	defer release()

	// A version 4 sender, which has no busy code, is told quota (which
	// it postpones as for room); a version 5 one busy.
	if code := offerPipelined(t, ctx, rawSenderVersion(t, dir, b, wire.Version4), o); code != wire.NackQuota {
		t.Errorf("version 4 sender offering a segment being received: NACK %s, want quota", code)
	}
	if code := offerPipelined(t, ctx, rawSenderVersion(t, dir, b, wire.Version5), o); code != wire.NackBusy {
		t.Errorf("version 5 sender offering a segment being received: NACK %s, want busy", code)
	}

	put(t, c, "same", content)
	// Enough refusals that counted as failed attempts they would have
	// deadlettered the record.
	// (Read between attempts: an attempt in flight is in Attempts and so
	// in the budget until its outcome is recorded.)
	var r rpc.Record
	waitUntil(t, "c refused more than max_retries times, or deadlettered", func() bool {
		var ok bool
		r, ok = recordOf(t, c, "same", "b")
		return ok && (r.State == ledger.StateDeadletter.String() ||
			r.State == ledger.StateFailed.String() && r.Attempts > maxRetries+2)
	})
	if r.State == ledger.StateDeadletter.String() {
		t.Fatalf("c deadlettered its record for b while b was taking in a's copy: %+v", r)
	}
	if !strings.Contains(r.LastError, string(wire.NackBusy)) {
		t.Errorf("c's record's last error %q, want the busy NACK", r.LastError)
	}
	if r.BudgetUsed != 0 {
		t.Errorf("c's record spent %d of its retry budget on busy refusals: %+v", r.BudgetUsed, r)
	}

	release()
	if res := <-first; res.Err != nil {
		t.Fatalf("a's copy: %v", res.Err)
	}
	waitUntil(t, "c's record acked or deadlettered", func() bool {
		r, ok := recordOf(t, c, "same", "b")
		return ok && (r.State == ledger.StateAcked.String() || r.State == ledger.StateDeadletter.String())
	})
	if r, _ := recordOf(t, c, "same", "b"); r.State != ledger.StateAcked.String() || r.BudgetUsed > 1 {
		t.Fatalf("c's record %+v, want acked with only the acknowledged attempt in its budget", r)
	}
	if n := testutil.ToFloat64(c.d.met.attempts.WithLabelValues("b", "failed")); n != 0 {
		t.Errorf("c counted %v failed attempts to b, want 0", n)
	}
	if n := testutil.ToFloat64(c.d.met.attempts.WithLabelValues("b", "deadletter")); n != 0 {
		t.Errorf("c counted %v deadletters to b, want 0", n)
	}
	if n := testutil.ToFloat64(b.d.met.nacks.WithLabelValues(string(wire.NackBusy))); n < maxRetries+3 {
		t.Errorf("b sent %v busy NACKs, want at least %d", n, maxRetries+3)
	}
	if n := testutil.ToFloat64(b.d.met.nacks.WithLabelValues(string(wire.NackInternal))); n != 0 {
		t.Errorf("b sent %v internal NACKs, want 0", n)
	}
	ix, err := b.client.Index(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, s := range ix.Segments {
		if s.ID == "same" {
			held++
			if s.SHA256 != o.SHA256 {
				t.Errorf("b holds %+v, want sha256 %s", s, o.SHA256)
			}
		}
	}
	if held != 1 {
		t.Fatalf("b holds %d copies of the segment, want 1", held)
	}
}

// TestBusyRefusalNotWarned: the receiver's refusal of a second copy while
// the first is arriving is logged below warn (nothing is wrong: the other
// copy will most likely be stored), so a node that peers race to fill
// does not page anyone; other refusals stay at warn (TestProtocolErrorsCounted).
func TestBusyRefusalNotWarned(t *testing.T) {
	dir, b, logs := receiverB(t)
	ctx := context.Background()
	content := bytes.Repeat([]byte("the same segment "), 20000) // offered, not pushed
	o := offer("same", content)
	release, first := firstCopyHalfSent(t, dir, b, o, content)
	defer release()
	if code := offerPipelined(t, ctx, rawSenderVersion(t, dir, b, wire.Version5), o); code != wire.NackBusy {
		t.Fatalf("second copy: NACK %s, want busy", code)
	}
	release()
	if res := <-first; res.Err != nil {
		t.Fatalf("first copy: %v", res.Err)
	}
	if strings.Contains(logs.String(), "segment refused") {
		t.Errorf("busy refusal logged at warn or above:\n%s", logs.String())
	}
}
