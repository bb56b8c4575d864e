// Package bench measures what Relay costs and how fast it runs: DynamoDB
// capacity units per delivered row for the relay and for a naive per-row
// outbox, those units and the Lambda and Scheduler invocations priced in
// dollars per million rows beside two alternative designs (bill.go), and
// delivery rate on the embedded bbolt store against bbolt's
// raw batched-put rate. Everything here is measured, never asserted; the
// figures go to docs/benchmarks.md with the command that produced them.
package bench

import (
	"context"
	"strconv"
	"sync"

	"github.com/relay-dev/relay/relaycore"
)

var _ relaycore.BatchGetter = (*Meter)(nil)

// Meter wraps a store and prices every request it sends with DynamoDB's
// published formulas, for the item layout infra/dynamo writes (docs/
// dynamodb.md): an item is its attribute names plus values, p (S), k (S),
// v (B), and, for due-indexed items, due (N) and ds (S).
//
//   - TransactWriteItems: 2 write units per started KB of every item in the
//     transaction; a put is billed on the larger of the old and new item, a
//     delete on the deleted item, a ConditionCheck on the checked item.
//   - Strongly consistent GetItem: 1 read unit per started 4 KB; an absent
//     item still costs 1. BatchGetItem prices each key the same way and
//     takes one request per 100 distinct keys.
//   - Query: the sizes of the items returned, summed, 1 read unit per
//     started 4 KB (minimum 1).
//   - A sparse keys-only GSI: 1 write unit per started KB of the index
//     entry for every put or delete of an indexed item (not doubled).
//
// The meter keeps a shadow of item sizes so deletes and condition checks
// are priced on the real old item. DynamoDB reports none of this from the
// in-process endpoint (minidyn returns no ConsumedCapacity), and infra/
// dynamo cannot size a transactional delete itself, which is why the
// benchmark prices requests here.
type Meter struct {
	relaycore.Store

	mu         sync.Mutex
	sizes      map[string]int // partition + "\x00" + key -> item size
	dueItems   map[string]int64
	WriteUnits float64
	IndexUnits float64
	ReadUnits  float64
	Calls      int
}

// NewMeter wraps st.
func NewMeter(st relaycore.Store) *Meter {
	return &Meter{Store: st, sizes: map[string]int{}, dueItems: map[string]int64{}}
}

// ItemSize is DynamoDB's size of the item infra/dynamo writes for one key.
func ItemSize(p relaycore.Partition, key string, valueLen int, due int64) int {
	n := 1 + len(p) + 1 + len(key)
	if valueLen > 0 {
		n += 1 + valueLen
	}
	if due != 0 {
		n += 3 + numberSize(due) + 2 + len("d#00")
	}
	return n
}

// numberSize is DynamoDB's size of a number: about 1 byte per 2 significant
// digits plus 1.
func numberSize(v int64) int {
	d := len(strconv.FormatInt(v, 10))
	return (d+1)/2 + 1
}

func writeUnits(size int) float64 { return float64(2 * ((max(size, 1) + 1023) / 1024)) }
func readUnits(size int) float64  { return float64(max(1, (size+4095)/4096)) }

func sk(p relaycore.Partition, key string) string { return string(p) + "\x00" + key }

// Get implements relaycore.Store.
func (m *Meter) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	v, ok, err := m.Store.Get(ctx, p, key)
	m.mu.Lock()
	m.Calls++
	m.ReadUnits += readUnits(m.sizes[sk(p, key)])
	m.mu.Unlock()
	return v, ok, err
}

// GetMany implements relaycore.BatchGetter, priced as the BatchGetItem
// requests infra/dynamo sends; it reads through the wrapped store's
// GetMany, or its Get per key.
func (m *Meter) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	vals, err := relaycore.GetMany(ctx, m.Store, p, keys)
	distinct := map[string]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	m.mu.Lock()
	m.Calls += (len(distinct) + 99) / 100
	for k := range distinct {
		m.ReadUnits += readUnits(m.sizes[sk(p, k)])
	}
	m.mu.Unlock()
	return vals, err
}

// Scan implements relaycore.Store.
func (m *Meter) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	pg, err := m.Store.Scan(ctx, p, req)
	m.mu.Lock()
	m.Calls++
	total := 0
	for _, it := range pg.Items {
		total += m.sizes[sk(p, it.Key)]
	}
	m.ReadUnits += readUnits(total)
	m.mu.Unlock()
	return pg, err
}

// Apply implements relaycore.Store.
func (m *Meter) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	err := m.Store.Apply(ctx, p, b)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Calls++
	if err != nil {
		return err // canceled transactions are not counted (DynamoDB publishes no price for them)
	}
	written := map[string]bool{}
	for _, w := range b.Writes {
		k := sk(p, w.Key)
		written[w.Key] = true
		old := m.sizes[k]
		if oldDue, ok := m.dueItems[k]; ok {
			m.IndexUnits += writeUnits(ItemSize(p, w.Key, 0, oldDue)) / 2
			delete(m.dueItems, k)
		}
		if w.Delete {
			m.WriteUnits += writeUnits(old)
			delete(m.sizes, k)
			continue
		}
		n := ItemSize(p, w.Key, len(w.Value), w.Due)
		m.WriteUnits += writeUnits(max(old, n))
		m.sizes[k] = n
		if w.Due != 0 {
			m.dueItems[k] = w.Due
			m.IndexUnits += writeUnits(ItemSize(p, w.Key, 0, w.Due)) / 2
		}
	}
	for _, pc := range b.Preconditions {
		if !written[pc.Key] {
			written[pc.Key] = true
			m.WriteUnits += writeUnits(m.sizes[sk(p, pc.Key)])
		}
	}
	return nil
}
