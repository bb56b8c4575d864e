package segstore

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Takedowns.
//
// A takedown evicts a stored segment for a request and leaves, in the
// same bbolt transaction that removes its index entry, a tombstone in the
// bucket "edge.tombstones" (id → what was evicted: size, digest, source,
// when, for which request) and the caller's receipt for that request in
// "edge.receipts" (id NUL request → the receipt's bytes, which the store
// does not read). The caller's seal runs in that transaction too, so the
// ledger's records can be cancelled atomically with it. A crash therefore
// leaves either the segment as it was, or the tombstone, the receipt and
// no index entry; the file or pack record is removed after the commit,
// and one a crash left behind is an orphan the next Open removes (a file
// without an index entry; dead space in a pack), as for any eviction.
//
// A tombstoned id is never stored again: Reserve (every receive and
// ingest path) refuses it with ErrEvicted. A Reader of the segment that
// was open when it was taken down (a delivery in progress) fails instead
// of handing over its last bytes, so no peer receives a whole copy after
// the takedown's commit.
//
// Tombstones are kept for good: they are small (about 200 bytes) and
// takedowns are rare, and a tombstone that went away would let the
// content back in. They live in edged.db: a database set aside as damaged
// (the daemon's self-repair) takes them with it, and the rebuilt node
// would accept the content again; the takedown owner sees such a node
// report the content again and orders it evicted anew.

var (
	tombstoneBucket = []byte("edge.tombstones")
	receiptBucket   = []byte("edge.receipts")
)

// Tombstone is what a takedown left of a segment.
type Tombstone struct {
	ID        string
	Size      int64
	SHA256    string
	Source    string    // the peer it came from; "" for a local ingest
	EvictedAt time.Time // the takedown's commit
	Request   string    // the request the segment was evicted for (the first, if several asked)
}

type storedTombstone struct {
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	Source    string `json:"source,omitempty"`
	EvictedNS int64  `json:"evicted_ns"`
	Request   string `json:"request"`
}

// TakedownResult is what Takedown did. Receipt is the receipt for the
// request asked, fresh or stored earlier.
type TakedownResult struct {
	Tombstone Tombstone
	Receipt   []byte
	// Evicted: this call removed the segment. False when the id was
	// tombstoned already (another request, or this one again).
	Evicted bool
	// Sealed: this call stored the receipt. False when the request's
	// receipt was stored already (the call changed nothing).
	Sealed bool
}

// Seal makes the receipt for request, of the takedown t records, inside
// tx, the transaction that tombstones the segment (and, on first
// eviction, removes its index entry). It may
// write to tx (cancel ledger records); its error aborts the whole
// transaction: nothing is evicted, nothing recorded.
type Seal func(tx *bolt.Tx, t Tombstone, request string) (receipt []byte, err error)

// Takedown evicts segment id for request and returns its receipt, made by
// seal. It is idempotent per (id, request): the same request again returns
// the stored receipt and changes nothing. Another request for an id
// already tombstoned gets a receipt of its own from seal, for the same
// tombstone (the same digest and eviction time): the node evicted that
// content then, and holds none of it now. An id neither stored nor
// tombstoned is ErrNotFound and nothing is signed: a receipt proves the
// eviction of content this node held. ErrBusy while the id is being
// written or evicted. Safe to retry after any error: either the
// transaction committed (the retry finds the tombstone and returns the
// receipt) or nothing changed.
func (s *Store) Takedown(id, request string, seal Seal) (TakedownResult, error) {
	if err := ValidID(id); err != nil {
		return TakedownResult{}, err
	}
	if request == "" || strings.IndexByte(request, 0) >= 0 {
		return TakedownResult{}, fmt.Errorf("takedown %s: %w: request id %q", id, ErrInvalid, request)
	}
	s.mu.Lock()
	if s.busy[id] {
		s.mu.Unlock()
		return TakedownResult{}, fmt.Errorf("takedown %s: %w", id, ErrBusy)
	}
	s.busy[id] = true
	s.mu.Unlock()
	var res TakedownResult
	var e Entry
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.busy, id)
		if res.Evicted {
			s.bytes -= e.Size
			s.count--
		}
	}()
	err := s.db.Update(func(tx *bolt.Tx) error {
		res = TakedownResult{}
		tb, err := tx.CreateBucketIfNotExists(tombstoneBucket)
		if err != nil {
			return err
		}
		rb, err := tx.CreateBucketIfNotExists(receiptBucket)
		if err != nil {
			return err
		}
		rkey := receiptKey(id, request)
		if v := tb.Get([]byte(id)); v != nil {
			t, err := decodeTombstone(id, v)
			if err != nil {
				return err
			}
			res.Tombstone = t
			if r := rb.Get(rkey); r != nil {
				res.Receipt = slices.Clone(r)
				return nil
			}
			if res.Receipt, err = seal(tx, t, request); err != nil {
				return err
			}
			res.Sealed = true
			return rb.Put(rkey, res.Receipt)
		}
		idx := tx.Bucket(indexBucket)
		v := idx.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		if e, err = decodeEntry(id, v); err != nil {
			return err
		}
		t := Tombstone{ID: id, Size: e.Size, SHA256: e.SHA256, Source: e.Source, EvictedAt: s.opt.Now().UTC(), Request: request}
		if res.Receipt, err = seal(tx, t, request); err != nil {
			return err
		}
		tv, err := json.Marshal(storedTombstone{Size: t.Size, SHA256: t.SHA256, Source: t.Source, EvictedNS: t.EvictedAt.UnixNano(), Request: request})
		if err != nil {
			return err
		}
		if err := tb.Put([]byte(id), tv); err != nil {
			return err
		}
		if err := rb.Put(rkey, res.Receipt); err != nil {
			return err
		}
		if wb := tx.Bucket(wantedBucket); wb != nil {
			if err := wb.Delete([]byte(id)); err != nil {
				return err
			}
		}
		res.Tombstone, res.Evicted, res.Sealed = t, true, true
		return idx.Delete([]byte(id))
	})
	if err != nil {
		res = TakedownResult{}
		return res, fmt.Errorf("takedown %s: %w", id, err)
	}
	if !res.Evicted {
		return res, nil
	}
	s.mu.Lock()
	s.tombs[id] = true
	delete(s.wanted, id)
	s.mu.Unlock()
	if err := s.hit(stepUnindex); err != nil {
		return res, fmt.Errorf("takedown %s: %w", id, err)
	}
	if err := s.unlinkEvicted(id, e.loc); err != nil {
		// The takedown is committed; the next start removes what is left.
		return res, fmt.Errorf("takedown %s: %w", id, err)
	}
	return res, nil
}

// receiptKey is id NUL request: ids hold no NUL, so one id's receipts are
// adjacent and in request order.
func receiptKey(id, request string) []byte {
	return append(append([]byte(id), 0), request...)
}

func decodeTombstone(id string, v []byte) (Tombstone, error) {
	var st storedTombstone
	if err := json.Unmarshal(v, &st); err != nil {
		return Tombstone{}, fmt.Errorf("decode tombstone %s: %w", id, err)
	}
	return Tombstone{ID: id, Size: st.Size, SHA256: st.SHA256, Source: st.Source, EvictedAt: time.Unix(0, st.EvictedNS).UTC(), Request: st.Request}, nil
}

// TombstoneOf returns id's tombstone, or ErrNotFound.
func (s *Store) TombstoneOf(id string) (Tombstone, error) {
	var t Tombstone
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(tombstoneBucket)
		var v []byte
		if b != nil {
			v = b.Get([]byte(id))
		}
		if v == nil {
			return fmt.Errorf("tombstone %s: %w", id, ErrNotFound)
		}
		var err error
		t, err = decodeTombstone(id, v)
		return err
	})
	return t, err
}

// StoredReceipt is one receipt Takedown stored.
type StoredReceipt struct {
	ID, Request string
	Receipt     []byte
}

// Receipts lists the stored receipts in (id, request) order; id "" lists
// every segment's.
func (s *Store) Receipts(id string) ([]StoredReceipt, error) {
	var out []StoredReceipt
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(receiptBucket)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		var prefix []byte
		if id != "" {
			prefix = append([]byte(id), 0)
		}
		for k, v := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, v = c.Next() {
			seg, req, ok := strings.Cut(string(k), "\x00")
			if !ok {
				return fmt.Errorf("receipt key %q: no separator", k)
			}
			out = append(out, StoredReceipt{ID: seg, Request: req, Receipt: slices.Clone(v)})
		}
		return nil
	})
	return out, err
}

// EachReceiptKey calls fn with the (id, request) of every stored receipt,
// in order, without reading the receipts (a caller looking for the few it
// has not handled yet need not copy them all). fn runs inside a read
// transaction: it must not call the Store.
func (s *Store) EachReceiptKey(fn func(id, request string) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(receiptBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			seg, req, ok := strings.Cut(string(k), "\x00")
			if !ok {
				return fmt.Errorf("receipt key %q: no separator", k)
			}
			return fn(seg, req)
		})
	})
}

// Receipt returns the receipt stored for (id, request), or ErrNotFound.
func (s *Store) Receipt(id, request string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(receiptBucket); b != nil {
			out = slices.Clone(b.Get(receiptKey(id, request)))
		}
		if out == nil {
			return fmt.Errorf("receipt %s for %s: %w", request, id, ErrNotFound)
		}
		return nil
	})
	return out, err
}

// loadTombs reads the tombstoned ids at Open. Only the keys: a value
// that no longer decodes still keeps its id out.
func (s *Store) loadTombs() error {
	s.tombs = map[string]bool{}
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(tombstoneBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			s.tombs[string(k)] = true
			return nil
		})
	})
}

// takenDown reports whether id was taken down (under s.mu or not).
func (s *Store) takenDown(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tombs[id]
}

// errTakenDown is a Reader's error for a segment taken down while it was
// read.
var errTakenDown = fmt.Errorf("%w while being read", ErrEvicted)
