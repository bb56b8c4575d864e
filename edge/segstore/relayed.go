package segstore

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// MarkRelayedAll is MarkRelayed for several segments in one transaction
// (a pipelining sender meets the success condition of a window of
// segments at once). It returns the entries whose marker this call set;
// ids not stored, or already marked, are skipped. Idempotent.
func (s *Store) MarkRelayedAll(ids []string) ([]Entry, error) {
	var marked []Entry
	err := s.db.Update(func(tx *bolt.Tx) error {
		marked = marked[:0]
		b := tx.Bucket(indexBucket)
		now := s.opt.Now().UTC()
		for _, id := range ids {
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			e, err := decodeEntry(id, v)
			if err != nil {
				return err
			}
			if e.Relayed {
				continue
			}
			e.Relayed, e.RelayedAt = true, now
			if err := putEntry(b, e); err != nil {
				return err
			}
			marked = append(marked, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mark relayed: %w", err)
	}
	return marked, nil
}

// ClearRelayedAll is ClearRelayed for several segments in one transaction
// (start-up reconciliation after a peer was added clears the marker of
// every stored segment the new peer does not hold yet). It returns the ids
// whose marker this call cleared, in the order given; ids not stored, or
// not marked, are skipped. Idempotent.
func (s *Store) ClearRelayedAll(ids []string) ([]string, error) {
	var cleared []string
	err := s.db.Update(func(tx *bolt.Tx) error {
		cleared = cleared[:0]
		b := tx.Bucket(indexBucket)
		for _, id := range ids {
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			e, err := decodeEntry(id, v)
			if err != nil {
				return err
			}
			if !e.Relayed {
				continue
			}
			e.Relayed, e.RelayedAt = false, time.Time{}
			if err := putEntry(b, e); err != nil {
				return err
			}
			cleared = append(cleared, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("clear relayed: %w", err)
	}
	return cleared, nil
}
