package bolt

import (
	"encoding/binary"

	"github.com/relay-dev/relay/relaycore"
)

// Bucket names inside a table bucket (see the package documentation).
var (
	partsBucket = []byte("part")
	dueBucket   = []byte("due")
	dueOfBucket = []byte("dueof")
)

// dueKeyPrefix is the fixed part of a due-index key: 8 bytes of time and
// one byte of partition length.
const dueKeyPrefix = 8 + 1

// itemRef is <len(p)><p><key>: an item's identity across partitions. The
// length byte keeps ("ab", "c") apart from ("a", "bc").
func itemRef(p relaycore.Partition, key string) []byte {
	b := make([]byte, 0, 1+len(p)+len(key))
	b = append(b, byte(len(p)))
	b = append(b, p...)
	return append(b, key...)
}

// decodeItemRef inverts itemRef; ok is false for a malformed reference.
func decodeItemRef(b []byte) (p relaycore.Partition, key string, ok bool) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", "", false
	}
	n := int(b[0])
	return relaycore.Partition(b[1 : 1+n]), string(b[1+n:]), true
}

// encodeDue maps int64 to 8 bytes whose byte order is numeric order: flip
// the sign bit so negative times sort before positive ones.
func encodeDue(due int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(due)^(1<<63))
}

func decodeDue(b []byte) int64 {
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63))
}

// dueKey is <due><itemRef>.
func dueKey(due int64, ref []byte) []byte {
	return append(encodeDue(due), ref...)
}
