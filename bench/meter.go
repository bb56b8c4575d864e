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
	"fmt"
	"strconv"
	"sync"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/relaycore"
)

var (
	_ relaycore.BatchGetter  = (*Meter)(nil)
	_ relaycore.LooseDeleter = (*Meter)(nil)
)

// Meter wraps a store and prices every request it sends with DynamoDB's
// published formulas, for the requests and the item layout infra/dynamo
// sends and writes (docs/dynamodb.md): an item is its attribute names plus
// values, p (S), k (S), v (B), and, for due-indexed items, due (N) and ds
// (S).
//
//   - TransactWriteItems (a batch on several keys): 2 write units per
//     started KB of every item in the transaction; a put is billed on the
//     larger of the old and new item, a delete on the deleted item, a
//     ConditionCheck on the checked item.
//   - PutItem and DeleteItem (a batch that writes one key, guarded only on
//     it: dynamo.SingleItem): 1 write unit per started KB, a put on the
//     larger of the old and new item, a delete on the deleted item, at
//     least 1; refused by its condition, 1 per started KB of the existing
//     item, at least 1.
//   - A precondition-only batch on one key (dynamo.SingleItem) is a
//     strongly consistent GetItem of the key.
//   - BatchWriteItem deletes (DeleteLoose): 1 write unit per started KB of
//     each deleted item, 1 for an absent one; one request per 25 distinct
//     keys.
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
// dynamo cannot size a delete itself, which is why the benchmark prices
// requests here.
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

// writeUnits is the write units of one item of size bytes: factor (2 in a
// transaction, 1 otherwise) per started KB, at least one KB.
func writeUnits(size, factor int) float64 { return float64(factor * ((max(size, 1) + 1023) / 1024)) }
func readUnits(size int) float64          { return float64(max(1, (size+4095)/4096)) }

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

// Apply implements relaycore.Store, priced as the TransactWriteItems,
// PutItem, DeleteItem or GetItem infra/dynamo sends for b.
func (m *Meter) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	err := m.Store.Apply(ctx, p, b)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Calls++
	single := dynamo.SingleItem(b)
	switch {
	case single && len(b.Writes) == 0:
		m.ReadUnits += readUnits(m.sizes[sk(p, b.Preconditions[0].Key)])
		return err
	case single && err != nil:
		if _, refused := relaycore.FailedPrecondition(err); refused {
			m.WriteUnits += writeUnits(m.sizes[sk(p, b.Writes[0].Key)], 1)
		}
		return err
	case err != nil:
		return err // canceled transactions are not counted (DynamoDB publishes no price for them)
	}
	factor := 2
	if single {
		factor = 1
	}
	written := map[string]bool{}
	for _, w := range b.Writes {
		written[w.Key] = true
		if w.Delete {
			m.delete(p, w.Key, factor)
			continue
		}
		k := sk(p, w.Key)
		m.unindex(p, w.Key)
		n := ItemSize(p, w.Key, len(w.Value), w.Due)
		m.WriteUnits += writeUnits(max(m.sizes[k], n), factor)
		m.sizes[k] = n
		if w.Due != 0 {
			m.dueItems[k] = w.Due
			m.IndexUnits += writeUnits(ItemSize(p, w.Key, 0, w.Due), 1)
		}
	}
	for _, pc := range b.Preconditions {
		if !written[pc.Key] {
			written[pc.Key] = true
			m.WriteUnits += writeUnits(m.sizes[sk(p, pc.Key)], factor)
		}
	}
	return nil
}

// DeleteLoose implements relaycore.LooseDeleter, priced as the
// BatchWriteItem requests infra/dynamo sends; the wrapped store must be a
// LooseDeleter too. On error any subset of the keys may be gone, so the
// meter prices all of them but keeps their shadow sizes (a later delete is
// then priced as if they were still there).
func (m *Meter) DeleteLoose(ctx context.Context, p relaycore.Partition, keys []string) error {
	ld, ok := m.Store.(relaycore.LooseDeleter)
	if !ok {
		return fmt.Errorf("meter: delete loose %s: %T is not a relaycore.LooseDeleter", p, m.Store)
	}
	err := ld.DeleteLoose(ctx, p, keys)
	distinct := map[string]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Calls += (len(distinct) + dynamo.MaxBatchWriteItems - 1) / dynamo.MaxBatchWriteItems
	for k := range distinct {
		if err != nil {
			m.WriteUnits += writeUnits(m.sizes[sk(p, k)], 1)
			continue
		}
		m.delete(p, k, 1)
	}
	return err
}

// delete prices the delete of key at factor write units per started KB of
// the deleted item (at least 1) and forgets the item. m.mu is held.
func (m *Meter) delete(p relaycore.Partition, key string, factor int) {
	k := sk(p, key)
	m.unindex(p, key)
	m.WriteUnits += writeUnits(m.sizes[k], factor)
	delete(m.sizes, k)
}

// unindex prices the removal of key's due-index entry, if it has one, by a
// put or delete of the item. m.mu is held.
func (m *Meter) unindex(p relaycore.Partition, key string) {
	k := sk(p, key)
	if oldDue, ok := m.dueItems[k]; ok {
		m.IndexUnits += writeUnits(ItemSize(p, key, 0, oldDue), 1)
		delete(m.dueItems, k)
	}
}
