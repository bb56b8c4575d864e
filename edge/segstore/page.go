package segstore

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ListAfter returns up to limit index entries whose ids sort after after
// ("" = from the first), in id order: a walk over the whole index that
// holds one page of it at a time (start-up reconciliation of 10,000
// segments held all of them, about 5 MB of heap, next to what the
// ledger work allocates). Each page is its own read transaction, so
// entries stored or removed between pages may or may not be seen.
func (s *Store) ListAfter(after string, limit int) ([]Entry, error) {
	out := make([]Entry, 0, max(0, min(limit, 1024))) // reconciliation's page, without regrowing
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(indexBucket).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && after != "" && bytes.Equal(k, []byte(after)) {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			e, err := decodeEntry(string(k), v)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list segments after %q: %w", after, err)
	}
	return out, nil
}
