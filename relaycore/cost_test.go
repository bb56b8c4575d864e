package relaycore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// unitStore bills every committed batch with relaycore.TransactWriteUnits,
// reading the sizes of deleted and checked items from the real store first.
type unitStore struct {
	relaycore.Store
	mu    sync.Mutex
	units map[string]int // by phase
	phase string
}

func (u *unitStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	caps := u.Capabilities()
	sizes := map[string]int{}
	for _, w := range b.Writes {
		if w.Delete {
			if v, ok, _ := u.Store.Get(ctx, p, w.Key); ok {
				sizes[w.Key] = caps.ItemSize(p, w.Key, len(v))
			}
		}
	}
	for _, pc := range b.Preconditions {
		if v, ok, _ := u.Store.Get(ctx, p, pc.Key); ok {
			sizes[pc.Key] = caps.ItemSize(p, pc.Key, len(v))
		}
	}
	if err := u.Store.Apply(ctx, p, b); err != nil {
		return err
	}
	n := relaycore.TransactWriteUnits(caps, p, b, func(k string) int { return sizes[k] })
	u.mu.Lock()
	u.units[u.phase] += n
	u.mu.Unlock()
	return nil
}

// BenchmarkRelayWriteUnits measures DynamoDB write units per delivered
// 200-byte row, end to end, for a realistic shape: 8 targets, enqueue calls
// of 400 rows, the paid plan. Reported, never asserted (issue §6).
func BenchmarkRelayWriteUnits(b *testing.B) {
	for range b.N {
		ctx := context.Background()
		src := &unitStore{Store: mem.New(relaycore.Capabilities{}), units: map[string]int{}}
		tgt := &unitStore{Store: mem.New(relaycore.Capabilities{}), units: map[string]int{}}
		clock := newTestClock()
		budget, _ := relaycore.PlanBudget("paid")
		h := &relaycore.RelayHandler{Source: src, Target: tgt, Budget: budget, Clock: clock}
		const calls, perCall = 10, 400
		value := strings.Repeat("v", 181)
		src.phase = "enqueue"
		for c := range calls {
			rows := make([]relaycore.Row, perCall)
			for i := range rows {
				rows[i] = put(relaycore.Partition(fmt.Sprintf("tenant-%d", i%8)), fmt.Sprintf("user/%06d/prof", c*perCall+i), value)
			}
			if _, err := relaycore.CommitRelayRows(ctx, src, clock, "src", nil, time.Time{}, rows, relaycore.EnqueueConfig{}); err != nil {
				b.Fatal(err)
			}
		}
		src.phase, tgt.phase = "fire", "apply"
		for {
			v, err := relaycore.InspectSource(ctx, src, "src")
			if err != nil {
				b.Fatal(err)
			}
			if v.Alarm == nil {
				break
			}
			clock.Set(time.UnixMilli(v.Alarm.DueMS))
			if _, err := h.Alarm(ctx, "src"); err != nil {
				b.Fatal(err)
			}
		}
		rows := float64(calls * perCall)
		enq, fire, apply := float64(src.units["enqueue"]), float64(src.units["fire"]), float64(tgt.units["apply"])
		b.ReportMetric(enq/rows, "enqueue-wcu/row")
		b.ReportMetric(apply/rows, "apply-wcu/row")
		b.ReportMetric(fire/rows, "cleanup-wcu/row")
		b.ReportMetric((enq+fire+apply)/rows, "wcu/row")
	}
}
