package bolt

import (
	"bytes"
	"context"
	"fmt"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
)

var (
	_ relaycore.Store       = (*Store)(nil)
	_ relaycore.DueIndex    = (*Store)(nil)
	_ relaycore.BatchGetter = (*Store)(nil)
)

// DefaultScanLimit is the page size Scan uses when the request's Limit is
// zero or negative.
const DefaultScanLimit = 1000

// Store is the storage contract on one table of a DB. It is safe for
// concurrent use; it holds no state of its own beyond the table name.
type Store struct {
	db    *bbolt.DB
	gc    *committer
	caps  relaycore.Capabilities
	table []byte
}

// Capabilities implements relaycore.Store.
func (s *Store) Capabilities() relaycore.Capabilities { return s.caps }

// Get implements relaycore.Store.
func (s *Store) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if err := s.ready(ctx); err != nil {
		return nil, false, fmt.Errorf("get %s: %w", p, err)
	}
	var (
		value []byte
		found bool
	)
	err := s.db.View(func(tx *bbolt.Tx) error {
		value, found = lookup(s.partition(tx, p), key)
		value = cloneValue(value, found)
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("get %s: %w", p, err)
	}
	return value, found, nil
}

// GetMany implements relaycore.BatchGetter with one read transaction, so
// every key is read from the same snapshot.
func (s *Store) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("get many %s: %w", p, err)
	}
	out := make(map[string][]byte, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	err := s.db.View(func(tx *bbolt.Tx) error {
		part := s.partition(tx, p)
		if part == nil {
			return nil
		}
		for _, k := range keys {
			if v, found := lookup(part, k); found {
				out[k] = cloneValue(v, true)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("get many %s: %w", p, err)
	}
	return out, nil
}

// Scan implements relaycore.Store. Next is set only when another key in
// range follows the page, so the last page always has an empty Next.
func (s *Store) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if err := s.ready(ctx); err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, err)
	}
	limit := req.Limit
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	var page relaycore.ScanPage
	err := s.db.View(func(tx *bbolt.Tx) error {
		part := s.partition(tx, p)
		if part == nil {
			return nil
		}
		c := part.Cursor()
		var k, v []byte
		if req.After != "" && req.After >= req.Start {
			k, v = c.Seek([]byte(req.After))
			if k != nil && string(k) == req.After {
				k, v = c.Next()
			}
		} else {
			k, v = c.Seek([]byte(req.Start))
		}
		end := []byte(req.End)
		for ; k != nil; k, v = c.Next() {
			if len(end) > 0 && bytes.Compare(k, end) >= 0 {
				return nil
			}
			if len(page.Items) == limit {
				page.Next = page.Items[limit-1].Key
				return nil
			}
			page.Items = append(page.Items, relaycore.Item{Key: string(k), Value: cloneValue(v, true)})
		}
		return nil
	})
	if err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, err)
	}
	return page, nil
}

// Apply implements relaycore.Store: one bbolt Update, shared with the
// Applys on the same file that arrive while another commits (committer).
// See the package documentation for which errors are surely-not-applied.
func (s *Store) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if err := s.ready(ctx); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	if err := s.caps.Check(p, b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	if err := checkKeys(b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	return s.gc.apply(&applyReq{ctx: ctx, s: s, p: p, b: b})
}

// applyAlone commits b in a transaction of its own.
func (s *Store) applyAlone(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	// committing is set once the callback has made every change; an error
	// after that came from bbolt's Commit.
	committing := false
	err := s.db.Update(func(tx *bbolt.Tx) error {
		// The writer lock may have been a long wait.
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.apply(tx, p, b); err != nil {
			return err
		}
		committing = true
		return nil
	})
	if committing {
		s.gc.settled(err)
	}
	if err == nil {
		return nil
	}
	return commitError(p, err, committing)
}

// apply runs inside the write transaction. Any error it returns rolls the
// transaction back.
func (s *Store) apply(tx *bbolt.Tx, p relaycore.Partition, b relaycore.Batch) error {
	part := s.partition(tx, p)
	for i, pc := range b.Preconditions {
		v, ok := lookup(part, pc.Key)
		if pc.Absent && !ok || !pc.Absent && ok && bytes.Equal(v, pc.Value) {
			continue
		}
		return &relaycore.ConditionFailedError{Index: i, Key: pc.Key}
	}
	if len(b.Writes) == 0 {
		return nil
	}
	tb, err := tx.CreateBucketIfNotExists(s.table)
	if err != nil {
		return err
	}
	var parts, due, dueOf *bbolt.Bucket
	for _, c := range []struct {
		b    **bbolt.Bucket
		name []byte
	}{{&parts, partsBucket}, {&due, dueBucket}, {&dueOf, dueOfBucket}} {
		if *c.b, err = tb.CreateBucketIfNotExists(c.name); err != nil {
			return err
		}
	}
	if part, err = parts.CreateBucketIfNotExists([]byte(p)); err != nil {
		return err
	}
	for _, w := range b.Writes {
		key := []byte(w.Key)
		ref := itemRef(p, w.Key)
		if old := dueOf.Get(ref); old != nil {
			if err := due.Delete(dueKey(decodeDue(old), ref)); err != nil {
				return err
			}
			if err := dueOf.Delete(ref); err != nil {
				return err
			}
		}
		if w.Delete {
			if err := part.Delete(key); err != nil {
				return err
			}
			continue
		}
		value := w.Value
		if value == nil {
			value = []byte{}
		}
		if err := part.Put(key, value); err != nil {
			return err
		}
		if w.Due != 0 {
			if err := due.Put(dueKey(w.Due, ref), []byte{}); err != nil {
				return err
			}
			if err := dueOf.Put(ref, encodeDue(w.Due)); err != nil {
				return err
			}
		}
	}
	if k, _ := part.Cursor().First(); k == nil {
		return parts.DeleteBucket([]byte(p))
	}
	return nil
}

// Due implements relaycore.DueIndex. limit <= 0 returns every entry due by
// before. Entries due at the same time come in (partition, key) order.
func (s *Store) Due(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	var out []relaycore.DueEntry
	err := s.db.View(func(tx *bbolt.Tx) error {
		tb := tx.Bucket(s.table)
		if tb == nil {
			return nil
		}
		due := tb.Bucket(dueBucket)
		if due == nil {
			return nil
		}
		c := due.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if limit > 0 && len(out) == limit {
				return nil
			}
			if len(k) < dueKeyPrefix {
				return fmt.Errorf("due index entry %x is too short", k)
			}
			t := decodeDue(k[:8])
			if t > before {
				return nil
			}
			p, key, ok := decodeItemRef(k[8:])
			if !ok {
				return fmt.Errorf("due index entry %x is malformed", k)
			}
			out = append(out, relaycore.DueEntry{Partition: p, Key: key, Due: t})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	return out, nil
}

// ready refuses calls that cannot proceed: a cancelled context or a Store
// without a table.
func (s *Store) ready(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(s.table) == 0 {
		return ErrInvalidTable
	}
	return nil
}

// partition returns p's bucket, or nil when the table or partition has
// never been written (or was emptied).
func (s *Store) partition(tx *bbolt.Tx, p relaycore.Partition) *bbolt.Bucket {
	if p == "" {
		return nil
	}
	tb := tx.Bucket(s.table)
	if tb == nil {
		return nil
	}
	parts := tb.Bucket(partsBucket)
	if parts == nil {
		return nil
	}
	return parts.Bucket([]byte(p))
}

// lookup reads key from part (nil: absent). It seeks rather than using
// Bucket.Get so that an empty value is told apart from absence without
// relying on how bbolt represents zero-length values. The returned slice
// is only valid inside the transaction.
func lookup(part *bbolt.Bucket, key string) ([]byte, bool) {
	if part == nil || key == "" {
		return nil, false
	}
	k, v := part.Cursor().Seek([]byte(key))
	if k == nil || string(k) != key {
		return nil, false
	}
	return v, true
}

// cloneValue copies a value out of bbolt's memory map, which is only valid
// during the transaction; a present empty value stays non-nil.
func cloneValue(v []byte, found bool) []byte {
	if !found {
		return nil
	}
	out := make([]byte, len(v))
	copy(out, v)
	return out
}
