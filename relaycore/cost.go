package relaycore

// DynamoDB write-unit accounting for a transactional batch, from DynamoDB's
// published formulas: a TransactWriteItems item costs 2 write units per
// started KB of item size; a delete is billed on the size of the deleted
// item, and a ConditionCheck (a precondition on a key the batch does not
// write) as a write of the checked item. DynamoDB bills a put on the larger
// of the old and new item; the engine's puts mostly create items or rewrite
// same-sized control records, so this counts the new item.

// writeUnitBytes is DynamoDB's write unit size.
const writeUnitBytes = 1024

// transactWriteUnits returns the write units DynamoDB would bill for b in
// partition p as one TransactWriteItems. existing gives the store's item size
// (Capabilities.ItemSize) of an item that is deleted or only checked; nil,
// or a result <= 0, counts such an item as its key alone (the minimum, one
// started KB).
func transactWriteUnits(caps Capabilities, p Partition, b Batch, existing func(key string) int) int {
	units := func(size int) int {
		if size <= 0 {
			size = 1
		}
		return 2 * ((size + writeUnitBytes - 1) / writeUnitBytes)
	}
	old := func(key string) int {
		if existing != nil {
			if s := existing(key); s > 0 {
				return s
			}
		}
		return caps.ItemSize(p, key, 0)
	}
	written := make(map[string]bool, len(b.Writes))
	total := 0
	for _, w := range b.Writes {
		written[w.Key] = true
		if w.Delete {
			total += units(old(w.Key))
		} else {
			total += units(caps.ItemSize(p, w.Key, len(w.Value)))
		}
	}
	checked := map[string]bool{}
	for _, pc := range b.Preconditions {
		if written[pc.Key] || checked[pc.Key] {
			continue
		}
		checked[pc.Key] = true
		total += units(old(pc.Key))
	}
	return total
}
