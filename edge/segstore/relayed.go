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
	_, marked, err := s.UpdateRelayed(nil, ids, nil)
	if err != nil {
		return nil, fmt.Errorf("mark relayed: %w", err)
	}
	return marked, nil
}

// UpdateRelayed clears the relayed marker of every stored id of clear
// that has one and sets it on every stored id of mark that has none, in
// one write transaction that first runs with (nil for none): the write of
// another package on the shared database that belongs with the markers.
// Start-up reconciliation writes a batch's new ledger records (ledger's
// EnsureScheduledIn) with the markers the batch clears, in one commit
// instead of two. It returns the entries it changed, as written, in the
// order given; an error from with changes nothing. Idempotent when with
// is.
func (s *Store) UpdateRelayed(clear, mark []string, with func(tx *bolt.Tx) error) (cleared, marked []Entry, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		if with != nil {
			if err := with(tx); err != nil {
				return err
			}
		}
		b, now := tx.Bucket(indexBucket), s.opt.Now().UTC()
		var err error
		if cleared, err = setRelayedIn(b, clear, false, time.Time{}); err != nil {
			return err
		}
		marked, err = setRelayedIn(b, mark, true, now)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("update relayed markers: %w", err)
	}
	return cleared, marked, nil
}

// setRelayedIn sets (relayed) or clears the relayed marker of every
// stored id of ids whose marker differs, in the index bucket b of a write
// transaction, and returns the entries it changed, as written, in the
// order given; at is the RelayedAt of a marker set.
func setRelayedIn(b *bolt.Bucket, ids []string, relayed bool, at time.Time) ([]Entry, error) {
	var changed []Entry
	for _, id := range ids {
		v := b.Get([]byte(id))
		if v == nil {
			continue
		}
		e, err := decodeEntry(id, v)
		if err != nil {
			return nil, err
		}
		if e.Relayed == relayed {
			continue
		}
		e.Relayed, e.RelayedAt = relayed, at
		if err := putEntry(b, e); err != nil {
			return nil, err
		}
		changed = append(changed, e)
	}
	return changed, nil
}
