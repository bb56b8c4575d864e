package relaycore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// TestEnqueueWiredFromHandler: what RelayHandler.Enqueue takes from the
// handler rather than from each call. The target store's limits refuse a
// row the source could hold but the target never take (nil Target: the
// source's limits), the handler's clock dates the commit, and the
// handler's Kicker gets the one kick, at the alarm's due time.
func TestEnqueueWiredFromHandler(t *testing.T) {
	ctx := t.Context()
	big := []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte(strings.Repeat("v", 2000))}}}}
	small := relaycore.Capabilities{MaxBatchItems: 25, MaxBatchBytes: 1 << 20, MaxItemBytes: 1 << 10}

	clock, k := newTestClock(), &recordingKicker{}
	src := mem.New(relaycore.Capabilities{})
	h := &relaycore.RelayHandler{Source: src, Target: mem.New(small), Clock: clock, Kicker: k}
	res, err := h.Enqueue(ctx, "orders", big, relaycore.EnqueueOptions{})
	var rowErr *relaycore.RowError
	if !errors.As(err, &rowErr) || rowErr.Index != 0 || res.Seqs[0] != 0 || len(k.kicks) != 0 {
		t.Fatalf("a row beyond the target's item limit: %+v, %v, kicks %v; want a RowError for row 0, nothing committed or kicked", res, err, k.kicks)
	}

	h.Target = nil // the source's limits, which take it
	res, err = h.Enqueue(ctx, "orders", big, relaycore.EnqueueOptions{})
	if err != nil || res.Seqs[0] != 1 {
		t.Fatalf("enqueue: %+v, %v", res, err)
	}
	if want := clock.Now().UnixMilli(); res.AlarmDueMS != want || len(k.kicks) != 1 || k.kicks[0] != want {
		t.Fatalf("alarm due %d, kicks %v; want one kick at the handler clock's now %d", res.AlarmDueMS, k.kicks, want)
	}

	_, err = h.Enqueue(ctx, "orders", big, relaycore.EnqueueOptions{Deadline: clock.Now()})
	if !errors.Is(err, relaycore.ErrDeadlineExceeded) || len(k.kicks) != 1 {
		t.Fatalf("enqueue at its deadline: %v, kicks %v; want ErrDeadlineExceeded and no kick", err, k.kicks)
	}
	if _, err := (&relaycore.RelayHandler{}).Enqueue(ctx, "orders", big, relaycore.EnqueueOptions{}); err == nil {
		t.Fatal("Enqueue without a Source store succeeded")
	}
}
