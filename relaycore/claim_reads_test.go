package relaycore_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// readBarrier holds each of the reads in front of a fire (rs, os and q,
// the retry markers) until all three of the same fire have arrived, from
// the alarm's second fire on (the first claims the source, so it reads
// rs first): a fire that makes them one after another hangs on it.
type readBarrier struct {
	mu      sync.Mutex
	rsReads int
	arrived int
	open    chan struct{}
}

func (b *readBarrier) hold(c call) error {
	kind := ""
	switch {
	case c.Op == "get" && c.Key == relaycore.KeyRS:
		kind = "rs"
	case c.Op == "scan" && c.Key == relaycore.KeyOS:
		kind = "os"
	case c.Op == "scan" && c.Key == "v/":
		kind = "markers"
	default:
		return nil
	}
	b.mu.Lock()
	if kind == "rs" {
		b.rsReads++
	}
	if b.rsReads < 2 || b.arrived >= 3 {
		b.mu.Unlock()
		return nil // the first fire's, or after the second fire's three
	}
	b.arrived++
	open := b.open
	if b.arrived == 3 {
		close(open)
	}
	b.mu.Unlock()
	<-open
	return nil
}

// TestKeptClaimReadsAtOnce: with DeliverConcurrency above 1, an alarm's
// fire after the first (its claim kept from the previous fire) reads rs,
// os and q and its due retry markers at the same time, one request's
// latency in front of the fire instead of three; the barrier lets none of
// them through before all three arrive. The alarm then delivers every row.
func TestKeptClaimReadsAtOnce(t *testing.T) {
	e := newEnv(t, "free")
	e.h.DeliverConcurrency = 2
	b := &readBarrier{open: make(chan struct{})}
	e.srcF.set(b.hold, nil)
	var rows []relaycore.Row
	for i := range 12 { // 8 targets a Free fire: two fires
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%02d", i)), "k", "v"))
	}
	e.enqueue(rows...)
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if ar.Fires != 2 || ar.RowsDelivered != 12 {
		t.Fatalf("alarm %+v, want 2 fires delivering 12 rows", ar)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.arrived != 3 {
		t.Errorf("%d of the second fire's reads met at the barrier, want 3", b.arrived)
	}
}
