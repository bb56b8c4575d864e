package dynamo

import (
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

// Stats counts the requests a Store sent and the capacity units they
// consume by DynamoDB's published formulas (docs/dynamodb.md, "Capacity").
// Endpoints used in tests return no ConsumedCapacity, so these are
// computed, not reported by the service.
type Stats struct {
	// Requests sent, counting every attempt.
	GetItem, BatchGetItem, Query, Scan, TransactWriteItems int64
	PutItem, DeleteItem, BatchWriteItem                    int64
	// Transactions is the number of Apply calls that committed as a
	// TransactWriteItems, SingleWrites those that committed as one PutItem
	// or DeleteItem (a batch on one key, see SingleItem), and Checks the
	// precondition-only batches on one key whose preconditions held (one
	// GetItem each).
	Transactions, SingleWrites, Checks int64
	// LooseDeletes is the number of keys DeleteLoose deleted (or found
	// absent): each distinct key once.
	LooseDeletes int64
	// Retries counts attempts after the first; Throttled the attempts
	// refused for throughput or a transaction conflict, and the
	// BatchGetItem and BatchWriteItem responses that left keys
	// unprocessed; Ambiguous the attempts whose outcome was unknown;
	// ConditionFailed the Apply calls refused by a precondition.
	Retries, Throttled, Ambiguous, ConditionFailed int64
	// ReadUnits are read capacity units: strongly consistent GetItem and
	// Query at 1 per started 4 KB, GSI Query at 0.5 per started 4 KB,
	// BatchGetItem as one GetItem per key read (absent keys cost 1).
	// DueScan reads are counted the same way over the items returned, which
	// under-counts the items the filter dropped.
	ReadUnits float64
	// WriteUnits are the table's write units: 2 per started KB of each
	// action's item in a committed transaction; 1 per started KB of the
	// item of a single write, committed or refused by its condition
	// (DynamoDB bills a refused conditional write by the existing item);
	// 1 per key of DeleteLoose.
	WriteUnits int64
	// IndexWriteUnits are the due GSI's write units of committed
	// transactions and single writes (an estimate, see docs/dynamodb.md).
	IndexWriteUnits int64
	// CanceledWriteUnits are what transactions refused by a condition would
	// have cost had they committed. DynamoDB does not publish what a
	// canceled transaction is billed, so this is an upper bound kept apart.
	CanceledWriteUnits int64
	// UnsizedWrites counts the puts and deletes counted in WriteUnits whose
	// previous item size the store could not know: no precondition named
	// it, a refused single write's response carried no item, or a loose
	// delete (priced at 1 unit per key). Their write units are lower
	// bounds: DynamoDB bills a put by the larger of the old and new item
	// and a delete by the deleted item.
	UnsizedWrites int64
}

type counters struct {
	getCalls, batchGetCalls, queryCalls, scanCalls  atomic.Int64
	transactCalls, putCalls, deleteCalls            atomic.Int64
	batchWriteCalls                                 atomic.Int64
	transactions, singleWrites, checks              atomic.Int64
	looseDeletes                                    atomic.Int64
	retries, throttles, ambiguous, conditionFailed  atomic.Int64
	readHalfUnits                                   atomic.Int64
	writeUnits, indexWriteUnits, canceledWriteUnits atomic.Int64
	unsized                                         atomic.Int64
}

// Stats returns a snapshot of the counters. The fields are read one by one,
// so a snapshot taken during concurrent calls may mix their effects.
func (s *Store) Stats() Stats {
	c := &s.stats
	return Stats{
		GetItem: c.getCalls.Load(), BatchGetItem: c.batchGetCalls.Load(),
		Query: c.queryCalls.Load(), Scan: c.scanCalls.Load(),
		TransactWriteItems: c.transactCalls.Load(),
		PutItem:            c.putCalls.Load(), DeleteItem: c.deleteCalls.Load(), BatchWriteItem: c.batchWriteCalls.Load(),
		Transactions: c.transactions.Load(), SingleWrites: c.singleWrites.Load(), Checks: c.checks.Load(),
		LooseDeletes: c.looseDeletes.Load(),
		Retries:      c.retries.Load(), Throttled: c.throttles.Load(), Ambiguous: c.ambiguous.Load(),
		ConditionFailed: c.conditionFailed.Load(),
		ReadUnits:       float64(c.readHalfUnits.Load()) / 2,
		WriteUnits:      c.writeUnits.Load(), IndexWriteUnits: c.indexWriteUnits.Load(),
		CanceledWriteUnits: c.canceledWriteUnits.Load(), UnsizedWrites: c.unsized.Load(),
	}
}

// costEstimate is the capacity one Apply consumes if it commits.
type costEstimate struct {
	write, index, unsized int64
}

func (c *counters) committed(t costEstimate) {
	c.writeUnits.Add(t.write)
	c.indexWriteUnits.Add(t.index)
	c.unsized.Add(t.unsized)
}

// numberSize is DynamoDB's size of a number: 1 byte per two significant
// digits (leading and trailing zeros trimmed) plus 1.
func numberSize(n string) int {
	n = strings.TrimLeft(n, "+-")
	if i := strings.IndexAny(n, "eE"); i >= 0 {
		n = n[:i]
	}
	n = strings.Replace(n, ".", "", 1)
	n = strings.Trim(n, "0")
	d := len(n)
	if d == 0 {
		d = 1
	}
	return (d+1)/2 + 1
}

func int64Digits(v int64) string {
	var b [20]byte
	i := len(b)
	u := uint64(v)
	if v < 0 {
		u = uint64(-v)
	}
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	return string(b[i:])
}

// itemSize is DynamoDB's size of the item this store writes for a key:
// attribute names plus values (strings and binaries by bytes).
func itemSize(p relaycore.Partition, key string, valueLen int, due int64) int {
	n := len(AttrPartition) + len(p) + len(AttrKey) + len(key)
	if valueLen > 0 {
		n += len(AttrValue) + valueLen
	}
	if due != 0 {
		n += len(AttrDue) + numberSize(int64Digits(due)) + len(AttrDueShard) + len("d#00")
	}
	return n
}

// indexEntrySize is the size of a keys-only due GSI entry: the table keys
// and the index keys.
func indexEntrySize(p relaycore.Partition, key string, due int64) int {
	return len(AttrPartition) + len(p) + len(AttrKey) + len(key) +
		len(AttrDue) + numberSize(int64Digits(due)) + len(AttrDueShard) + len("d#00")
}

// attrMapSize sizes an item as returned by DynamoDB.
func attrMapSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, av := range item {
		n += len(name)
		switch v := av.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
		case *types.AttributeValueMemberB:
			n += len(v.Value)
		case *types.AttributeValueMemberN:
			n += numberSize(v.Value)
		default:
			n++
		}
	}
	return n
}

// writeUnits is standard write units for an item: 1 per started KB, at
// least 1 (a write of an absent item is still billed).
func writeUnits(size int) int64 { return max(1, int64((size+1023)/1024)) }

// readUnits is strongly consistent read units for size bytes read in one
// request: 1 per started 4 KB, at least 1 (reading nothing is billed).
func readUnits(size int) int64 { return max(1, int64((size+4095)/4096)) }

// writeCost estimates the capacity of items if they commit, at factor
// write units per started KB of each item (2 in a transaction, 1 for a
// single write), from what the batch reveals: a Value precondition tells
// the old item's size, Absent tells there was none; otherwise the old size
// is unknown and counted as zero.
func (s *Store) writeCost(p relaycore.Partition, b relaycore.Batch, items []txItem, factor int64) costEstimate {
	var t costEstimate
	for _, it := range items {
		old, known, absent := 0, false, false
		for _, i := range it.pcs {
			pc := b.Preconditions[i]
			known = true
			if pc.Absent {
				absent = true
			} else {
				old = itemSize(p, it.key, len(pc.Value), 0)
			}
		}
		switch {
		case it.write == nil:
			t.write += factor * writeUnits(old)
		case it.write.Delete:
			if !known {
				t.unsized++
			}
			t.write += factor * writeUnits(old)
		default:
			if !known {
				t.unsized++
			}
			w := it.write
			t.write += factor * writeUnits(max(old, itemSize(p, w.Key, len(w.Value), w.Due)))
			if w.Due != 0 {
				// Keys-only GSI: a new entry is one index write; replacing
				// an entry whose due may have changed is a delete plus a
				// put. Index propagation is not transactional, so 1x.
				n := int64(2)
				if absent {
					n = 1
				}
				t.index += n * writeUnits(indexEntrySize(p, w.Key, w.Due))
			}
		}
	}
	return t
}
