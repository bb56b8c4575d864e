package bolt

import (
	"errors"
	"fmt"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
)

// ErrInvalidTable is returned by every call on a Store whose table name is
// empty. Nothing is read or written.
var ErrInvalidTable = errors.New("bolt: table name must not be empty")

// MaxKeyLen bounds the length of a written key: bbolt refuses keys over
// bbolt.MaxKeySize, and the due index prefixes a key with 9 bytes and its
// partition name. Apply refuses longer keys with relaycore.ErrInvalidBatch.
const MaxKeyLen = bbolt.MaxKeySize - dueKeyPrefix - relaycore.MaxPartitionLen

// checkKeys refuses written keys bbolt could not index, before the
// transaction starts, so the refusal is an ordinary invalid batch.
func checkKeys(b relaycore.Batch) error {
	for _, w := range b.Writes {
		if len(w.Key) > MaxKeyLen {
			return fmt.Errorf("%w: key of %d bytes, limit %d", relaycore.ErrInvalidBatch, len(w.Key), MaxKeyLen)
		}
	}
	return nil
}
