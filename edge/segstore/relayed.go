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
	changed, err := s.setRelayedAll(ids, true)
	if err != nil {
		return nil, fmt.Errorf("mark relayed: %w", err)
	}
	return changed, nil
}

// ClearRelayedAll is ClearRelayed for several segments in one transaction
// (start-up reconciliation after a peer was added clears the marker of
// every stored segment the new peer does not hold yet). It returns the ids
// whose marker this call cleared, in the order given; ids not stored, or
// not marked, are skipped. Idempotent.
func (s *Store) ClearRelayedAll(ids []string) ([]string, error) {
	changed, err := s.setRelayedAll(ids, false)
	if err != nil {
		return nil, fmt.Errorf("clear relayed: %w", err)
	}
	cleared := make([]string, len(changed))
	for i, e := range changed {
		cleared[i] = e.ID
	}
	return cleared, nil
}

// setRelayedAll sets (relayed) or clears the relayed marker of every
// stored id of ids whose marker differs, in one transaction, and returns
// the entries it changed, as written, in the order given.
func (s *Store) setRelayedAll(ids []string, relayed bool) ([]Entry, error) {
	var changed []Entry
	err := s.db.Update(func(tx *bolt.Tx) error {
		changed = changed[:0]
		b := tx.Bucket(indexBucket)
		at := time.Time{}
		if relayed {
			at = s.opt.Now().UTC()
		}
		for _, id := range ids {
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			e, err := decodeEntry(id, v)
			if err != nil {
				return err
			}
			if e.Relayed == relayed {
				continue
			}
			e.Relayed, e.RelayedAt = relayed, at
			if err := putEntry(b, e); err != nil {
				return err
			}
			changed = append(changed, e)
		}
		return nil
	})
	return changed, err
}
