package relaycore

// KV is one key and value a relay row puts at its target.
type KV struct {
	Key   string
	Value []byte
}

// Row is one outbox entry: writes for one target, applied atomically at the
// target, in seq order with the source's other rows for that target. Puts
// and Deletes must name disjoint keys. Seq and CommitMS are set by the
// engine (on enqueue results and decoded pages); callers leave them zero.
type Row struct {
	Target   Partition
	Puts     []KV
	Deletes  []string
	Seq      uint64
	CommitMS int64
}
