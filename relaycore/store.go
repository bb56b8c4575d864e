package relaycore

import (
	"cmp"
	"context"
	"fmt"
)

// Partition names one group of ordered keys: a source's outbox or a target's
// keys. In DynamoDB it is the partition-key value; in bbolt, a bucket.
// It must be non-empty and at most MaxPartitionLen bytes.
type Partition string

// MaxPartitionLen bounds partition names (DynamoDB allows 2048 bytes for a
// partition key; we keep names short because every item repeats them).
const MaxPartitionLen = 255

// Item is one key and its value, as returned by Get and Scan.
type Item struct {
	Key   string
	Value []byte
}

// Precondition guards a batch: the batch commits only if, at commit time,
// Key holds exactly Value (byte-equal), or is absent when Absent is true.
// Value is ignored when Absent is set. An empty non-nil Value is not the
// same as absence.
type Precondition struct {
	Key    string
	Value  []byte
	Absent bool
}

// Write is one put or delete in a batch. Deleting an absent key succeeds.
//
// Due, when non-zero on a put, lists the item in the store's due index
// (see DueIndex) under that time in unix milliseconds; a later put without
// Due or a delete removes it from the index. The engine uses this for the
// durable alarm record so a sweeper can find overdue alarms without
// scanning every partition.
type Write struct {
	Key    string
	Value  []byte
	Delete bool
	Due    int64
}

// Batch is an atomic unit: every precondition holds and every write is
// applied, or nothing is. A key may appear in at most one Write; a key may
// appear both as a Precondition and as a Write (the store merges them into
// one conditional write). Preconditions are evaluated against the state
// before the batch.
type Batch struct {
	Preconditions []Precondition
	Writes        []Write
}

// Capabilities are a store's hard limits. The engine plans batches within
// them; a store refuses (with ErrBatchTooLarge / ErrValueTooLarge, surely
// not applied) a batch that exceeds them rather than splitting it.
type Capabilities struct {
	// MaxBatchItems bounds the number of distinct keys in one batch
	// (preconditions and writes together). DynamoDB: 100.
	MaxBatchItems int
	// MaxBatchBytes bounds the sum of ItemSize over a batch's writes.
	// DynamoDB: 4 MB per TransactWriteItems.
	MaxBatchBytes int
	// MaxItemBytes bounds ItemSize of one written item. DynamoDB: 400 KB.
	MaxItemBytes int
	// ItemOverhead is added to len(partition)+len(key)+len(value) to get the
	// store's own size of an item (attribute names, type tags, index
	// attributes). It must not under-count.
	ItemOverhead int
	// WideNonASCII means the store keeps partition names and keys as
	// strings in which every byte >= 0x80 takes two bytes (infra/dynamo
	// stores each byte as one UTF-8 character so arbitrary keys round-trip
	// and keep their order). ItemSize then counts those bytes twice, so the
	// overhead can stay exact for the common ASCII keys.
	WideNonASCII bool
	// UncompressedPages means the engine stores row pages without
	// compressing them (docs/layout.md, "Row pages"): for a store that
	// neither bills nor limits by the KB (infra/postgres), DEFLATE would
	// spend the relay's CPU on every enqueue and fire to save bytes that
	// cost nothing. Pages are still bounded by the page budget and these
	// limits as stored; every engine reads compressed and uncompressed
	// pages alike, so the flag may differ between releases or replicas
	// on one store. False (the default): pages are compressed where that
	// shortens them, as on DynamoDB, where page bytes are most of the bill.
	UncompressedPages bool
}

// ItemSize is the size the store accounts for one item. Planners use it to
// keep batches within MaxBatchBytes and items within MaxItemBytes, and the
// engine to fill row pages just below the store's billing units.
func (c Capabilities) ItemSize(p Partition, key string, valueLen int) int {
	n := len(p) + len(key) + valueLen + c.ItemOverhead
	if c.WideNonASCII {
		n += highBytes(string(p)) + highBytes(key)
	}
	return n
}

// KeyLen is the stored length of a key: len(key), or more when
// WideNonASCII widens its non-ASCII bytes. Stores' key-length limits apply
// to it.
func (c Capabilities) KeyLen(key string) int {
	if c.WideNonASCII {
		return len(key) + highBytes(key)
	}
	return len(key)
}

func highBytes(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			n++
		}
	}
	return n
}

// Check reports whether b fits c, naming the first limit it breaks. Stores
// call it before sending; planners may call it to assert their plans.
func (c Capabilities) Check(p Partition, b Batch) error {
	if p == "" || len(p) > MaxPartitionLen {
		return fmt.Errorf("%w: partition name must be 1..%d bytes", ErrInvalidBatch, MaxPartitionLen)
	}
	keys := make(map[string]struct{}, len(b.Preconditions)+len(b.Writes))
	for _, pc := range b.Preconditions {
		if pc.Key == "" {
			return fmt.Errorf("%w: empty precondition key", ErrInvalidBatch)
		}
		keys[pc.Key] = struct{}{}
	}
	size := 0
	written := make(map[string]struct{}, len(b.Writes))
	for _, w := range b.Writes {
		if w.Key == "" {
			return fmt.Errorf("%w: empty write key", ErrInvalidBatch)
		}
		if _, dup := written[w.Key]; dup {
			return fmt.Errorf("%w: key %q written twice in one batch", ErrInvalidBatch, w.Key)
		}
		written[w.Key] = struct{}{}
		keys[w.Key] = struct{}{}
		s := c.ItemSize(p, w.Key, len(w.Value))
		if !w.Delete && c.MaxItemBytes > 0 && s > c.MaxItemBytes {
			return fmt.Errorf("%w: key %q is %d bytes, limit %d", ErrValueTooLarge, w.Key, s, c.MaxItemBytes)
		}
		size += s
	}
	if len(keys) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidBatch)
	}
	if c.MaxBatchItems > 0 && len(keys) > c.MaxBatchItems {
		return fmt.Errorf("%w: %d items, limit %d", ErrBatchTooLarge, len(keys), c.MaxBatchItems)
	}
	if c.MaxBatchBytes > 0 && size > c.MaxBatchBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBatchTooLarge, size, c.MaxBatchBytes)
	}
	return nil
}

// ScanRequest selects keys in [Start, End) of one partition, in ascending
// key order, strictly after After when After is non-empty. End == "" means
// no upper bound. Limit > 0 bounds the page; Limit <= 0 lets the store pick
// its own page size.
type ScanRequest struct {
	Start, End string
	After      string
	Limit      int
}

// ScanPage is one page of a scan. Next is empty when the range is
// exhausted; otherwise pass it as After to read the next page. A page may
// hold fewer than Limit items (even zero) while Next is non-empty.
type ScanPage struct {
	Items []Item
	Next  string
}

// Store is the storage contract the engine consumes: partitions of ordered
// string keys with byte values, strongly consistent reads, and conditional
// atomic batches. Implementations: infra/bolt (embedded default),
// infra/dynamo (DynamoDB), infra/postgres (PostgreSQL), infra/mem (tests
// and simulation). The shared
// conformance suite in relaycore/storetest runs against each of them.
//
// Error rules (the ones delivery code lives or dies by):
//   - A *ConditionFailedError from Apply means the batch was surely not
//     applied, and names the first precondition found false.
//   - An error for which MayBeApplied reports true means the batch may or
//     may not have been applied (timeout after send, lost response). The
//     caller must re-read before deciding; retrying the same batch is safe
//     only because every engine batch is guarded.
//   - Any other error from Apply means the batch was surely not applied.
//   - Reads (Get, Scan, and BatchGetter's GetMany) never change state, so
//     retrying them is always safe.
type Store interface {
	// Get returns the value of key, with found == false (and a nil error)
	// when the key is absent. Reads are strongly consistent: they observe
	// every batch whose Apply returned nil before Get was called.
	Get(ctx context.Context, p Partition, key string) (value []byte, found bool, err error)

	// Scan returns one page of keys in ascending order (see ScanRequest).
	// An absent partition is an empty range, not an error.
	Scan(ctx context.Context, p Partition, req ScanRequest) (ScanPage, error)

	// Apply commits b atomically within partition p: all preconditions hold
	// and all writes land, or nothing changes. See Store for error rules.
	Apply(ctx context.Context, p Partition, b Batch) error

	// Capabilities reports the store's batch and item limits. Constant for
	// the store's lifetime.
	Capabilities() Capabilities
}

// BatchGetter is implemented by stores that read many keys of one
// partition in one round trip. It is optional: the engine calls GetMany
// (the function), which uses it when the store has it and falls back to one
// Get per key otherwise, so wrappers and test fakes that implement only
// Store keep working. A wrapper that intercepts Get (fault injection,
// counting) must implement BatchGetter itself or not at all; embedding a
// concrete store would let GetMany bypass its Get.
type BatchGetter interface {
	// GetMany returns the values of keys in partition p. A key that is
	// present maps to its value (non-nil, possibly empty, a copy the caller
	// may keep); an absent key is simply missing from the map, as is a key
	// no batch could have written (empty, or too long for the store). An
	// absent partition gives an empty map. Keys may repeat; each distinct
	// key appears once. An empty or nil keys gives an empty, non-nil map
	// and sends nothing. There is no bound on len(keys): a store splits the
	// list into as many requests as its service needs (infra/dynamo: one
	// BatchGetItem per 100 distinct keys).
	//
	// Consistency is Get's: every key observes every batch whose Apply
	// returned nil before GetMany was called. Atomicity across keys is only
	// what the store gives: infra/mem and infra/bolt read all keys from one
	// snapshot, but infra/dynamo (and the Get fallback) read each key on
	// its own, so of a batch applied concurrently with the call some keys
	// may show its writes and others not. The engine must not infer from
	// one key's value what another key holds.
	//
	// On error the map is nil and nothing is returned for any key. Reads
	// never change state, so retrying GetMany is always safe.
	GetMany(ctx context.Context, p Partition, keys []string) (map[string][]byte, error)
}

// LooseDeleter is implemented by stores on which deleting keys one by one,
// outside an atomic batch, costs less than deleting them inside one:
// DynamoDB bills a delete in a TransactWriteItems 2 write units per started
// KB of the item and a BatchWriteItem delete 1. It is optional: on a store
// without it the engine deletes delivered pages in its checkpoint batch; on
// one with it the checkpoint records them as deleted (rs) and the fire then
// deletes them loosely (docs/layout.md, "Loose deletes"). Like BatchGetter,
// a wrapper that intercepts Apply must implement it itself or not at all.
type LooseDeleter interface {
	// DeleteLoose deletes keys of partition p, each on its own: no
	// precondition, no atomicity across keys, no order. An absent key is
	// not an error, and keys may repeat. On error any subset of the keys
	// may have been deleted; deleting again is always safe, because the
	// engine deletes loosely only keys that no batch writes again. An empty
	// or nil keys sends nothing.
	DeleteLoose(ctx context.Context, p Partition, keys []string) error
}

// GetMany reads keys of partition p in one round trip when st implements
// BatchGetter, and with one Get per distinct key otherwise; see
// BatchGetter.GetMany for the result and its consistency. It does not look
// through Unwrap: a wrapper without GetMany wants its Get to see every
// read.
func GetMany(ctx context.Context, st Store, p Partition, keys []string) (map[string][]byte, error) {
	if bg, ok := st.(BatchGetter); ok {
		return bg.GetMany(ctx, p, keys)
	}
	out := make(map[string][]byte, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		v, ok, err := st.Get(ctx, p, k)
		if err != nil {
			return nil, err
		}
		if ok {
			if v == nil {
				v = []byte{}
			}
			out[k] = v
		}
	}
	return out, nil
}

// DueIndex is implemented by stores that index items written with
// Write.Due. The sweeper uses it to find overdue alarms without scanning
// every partition.
type DueIndex interface {
	// Due returns up to limit entries whose due time is <= before, oldest
	// first. An entry is a hint: the sweeper must re-read the item, because
	// it may have been rewritten since the index was read.
	Due(ctx context.Context, before int64, limit int) ([]DueEntry, error)
}

// DueEntry is one item listed in a DueIndex.
type DueEntry struct {
	Partition Partition
	Key       string
	Due       int64
}

// Compare orders entries oldest first, as DueIndex.Due returns them, and
// entries due at the same time by partition, then key, so an index that
// gathers its entries in no order can return them in a deterministic one:
// slices.SortFunc(entries, DueEntry.Compare).
func (e DueEntry) Compare(o DueEntry) int {
	return cmp.Or(cmp.Compare(e.Due, o.Due), cmp.Compare(e.Partition, o.Partition), cmp.Compare(e.Key, o.Key))
}
