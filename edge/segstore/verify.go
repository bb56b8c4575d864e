package segstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Verify on read.
//
// The start-up check hashes stored segments only after an unclean stop
// (or with storage.verify_on_start: always), so a copy damaged while the
// agent ran, or between a clean stop and the next start, went on being
// vouched for by the index. Every Reader therefore hashes what it reads:
// a read that reaches the end of the segment compares the digest before it
// hands over the last bytes, and a mismatch (or a segment file that ends
// early) is ErrDamaged instead, with the copy quarantined as the start-up
// check does it (moved or copied to QuarantineDir, durably, before its
// index entry goes) and recorded as wanted (wanted.go). A sender reads
// every byte it sends, so a damaged copy never leaves whole: the frame is
// cut short and the receiver stores nothing. The hash is the price:
// SHA-256 of every byte sent, once more (the receiver hashes it too).

// verifier hashes a Reader's bytes against its entry.
type verifier struct {
	s    *Store
	e    Entry
	h    hash.Hash
	read int64
	err  error // the damage found, returned by every later Read
}

func newVerifier(s *Store, e Entry) *verifier { return &verifier{s: s, e: e, h: sha256.New()} }

// Read reads from the segment and checks it once the read reaches the
// entry's size (or the data ends short of it).
func (r *Reader) Read(p []byte) (int, error) {
	v := r.v
	if v == nil {
		return r.SectionReader.Read(p)
	}
	if v.err != nil {
		return 0, v.err
	}
	if left := v.e.Size - v.read; int64(len(p)) > left {
		// Bytes past the entry's size are not the segment's: a file that
		// grew is read to its end only by Verify, which reports it.
		if left == 0 {
			return r.SectionReader.Read(p) // read whole and checked
		}
		p = p[:left]
	}
	n, err := r.SectionReader.Read(p)
	v.h.Write(p[:n])
	v.read += int64(n)
	var reason string
	switch {
	case v.read == v.e.Size && v.s.takenDown(v.e.ID):
		// Taken down while being read: the last bytes stay here, so the
		// peer never holds a whole copy made after the takedown.
		v.err = fmt.Errorf("read %s: %w", v.e.ID, errTakenDown)
		return 0, v.err
	case v.read == v.e.Size:
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.e.SHA256 {
			reason = fmt.Sprintf("read back: content sha256 %s, index entry %s", got, v.e.SHA256)
		}
	case errors.Is(err, io.EOF):
		reason = fmt.Sprintf("read back: ends after %d bytes, index entry %d", v.read, v.e.Size)
	}
	if reason == "" {
		return n, err
	}
	v.err = fmt.Errorf("read %s: %w: %s", v.e.ID, ErrDamaged, reason)
	if q, ok, qerr := v.s.quarantineStored(v.e, reason); qerr != nil {
		v.err = fmt.Errorf("%w (quarantine failed: %v)", v.err, qerr)
	} else if ok && v.s.opt.OnQuarantine != nil {
		v.s.opt.OnQuarantine(q)
	}
	return 0, v.err
}

// Seek repositions the reader. Back to the start, verification starts
// over; anywhere else it stops, since the bytes read would no longer be
// the whole segment in order.
func (r *Reader) Seek(offset int64, whence int) (int64, error) {
	pos, err := r.SectionReader.Seek(offset, whence)
	if r.v != nil && err == nil && r.v.err == nil {
		if pos == 0 {
			r.v.h.Reset()
			r.v.read = 0
		} else {
			r.v = nil
		}
	}
	return pos, err
}

// quarantineStored takes a stored copy found damaged out of the store:
// its file moved, or its record copied, to QuarantineDir (durably), then
// its index entry dropped and the id recorded as wanted, in one
// transaction, then its space returned (a packed record is punched once
// its last reader closes). It does nothing (ok false) if the id is being
// written or evicted, or its entry is no longer e: someone else took it
// out, or replaced it.
func (s *Store) quarantineStored(e Entry, reason string) (q Quarantined, ok bool, err error) {
	s.mu.Lock()
	if s.busy[e.ID] {
		s.mu.Unlock()
		return Quarantined{}, false, nil
	}
	s.busy[e.ID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, e.ID)
		s.mu.Unlock()
	}()
	cur, err := s.Stat(e.ID)
	if errors.Is(err, ErrNotFound) || err == nil && (cur.SHA256 != e.SHA256 || cur.loc != e.loc) {
		return Quarantined{}, false, nil
	}
	if err != nil {
		return Quarantined{}, false, err
	}
	if e.Packed() {
		q, err = s.quarantineRecord(e.ID, e.loc, reason)
	} else {
		q, err = s.quarantineFile(e.ID, reason)
	}
	if err != nil {
		return Quarantined{}, false, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(indexBucket).Delete([]byte(e.ID)); err != nil {
			return err
		}
		return putWanted(tx, e, s.opt.Now())
	})
	if err != nil {
		// The copy is in QuarantineDir and, for a file, gone from its
		// place: the next start drops the entry (missing file) or
		// quarantines the record again.
		return Quarantined{}, false, fmt.Errorf("quarantine %s: drop index entry: %w", e.ID, err)
	}
	q.Found = FoundOnRead
	s.mu.Lock()
	s.bytes -= e.Size
	s.count--
	s.live = append(s.live, q)
	s.wanted[e.ID] = true
	s.mu.Unlock()
	if e.Packed() {
		s.evictPacked(e.loc)
	}
	return q, true, nil
}

// Quarantined returns every copy quarantined since Open: at start (as in
// Recovered) and found damaged on read since.
func (s *Store) Quarantined() []Quarantined {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Concat(s.scan.Quarantined, s.live)
}

// Wanted segments.
//
// A segment this store acknowledged and then lost (quarantined as damaged,
// or its file gone at start) is recorded in the bucket "edge.wanted" of
// the store's database, with the size, digest and source its index entry
// had, in the transaction that drops the entry. The daemon asks peers
// that hold it for a good copy (a WANT on the wire, docs/wire.md); storing
// the id again removes the record (Staged.Commit, and Open for a crash
// in between).

var wantedBucket = []byte("edge.wanted")

// Wanted is a segment the store lost after acknowledging it.
type Wanted struct {
	ID     string
	Size   int64
	SHA256 string
	Source string    // the peer it came from; "" for a local ingest
	Since  time.Time // when it was lost
}

type storedWanted struct {
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
	Source  string `json:"source,omitempty"`
	SinceNS int64  `json:"since_ns"`
}

func putWanted(tx *bolt.Tx, e Entry, now time.Time) error {
	b, err := tx.CreateBucketIfNotExists(wantedBucket)
	if err != nil {
		return err
	}
	v, err := json.Marshal(storedWanted{Size: e.Size, SHA256: e.SHA256, Source: e.Source, SinceNS: now.UnixNano()})
	if err != nil {
		return err
	}
	return b.Put([]byte(e.ID), v)
}

// loadWanted reads the wanted ids at Open, dropping those stored again (a
// crash came between a commit and its Unwant).
func (s *Store) loadWanted() error {
	s.wanted = map[string]bool{}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(wantedBucket)
		if b == nil {
			return nil
		}
		idx := tx.Bucket(indexBucket)
		var stored [][]byte
		err := b.ForEach(func(k, _ []byte) error {
			if idx.Get(k) != nil {
				stored = append(stored, slices.Clone(k))
			} else {
				s.wanted[string(k)] = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range stored {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// Wanted lists the segments the store lost and wants back, in id order.
func (s *Store) Wanted() ([]Wanted, error) {
	var out []Wanted
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(wantedBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var w storedWanted
			if err := json.Unmarshal(v, &w); err != nil {
				return fmt.Errorf("decode wanted %s: %w", k, err)
			}
			out = append(out, Wanted{ID: string(k), Size: w.Size, SHA256: w.SHA256, Source: w.Source, Since: time.Unix(0, w.SinceNS).UTC()})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list wanted: %w", err)
	}
	return out, nil
}

// WantedCount is how many segments the store wants back (for a gauge:
// no database read).
func (s *Store) WantedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.wanted)
}

// Unwant removes id from the wanted segments: it was stored again, or an
// operator gives up on it. Idempotent.
func (s *Store) Unwant(id string) error {
	s.mu.Lock()
	delete(s.wanted, id)
	s.mu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(wantedBucket); b != nil {
			return b.Delete([]byte(id))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("unwant %s: %w", id, err)
	}
	return nil
}

// refetched is called after id committed: if the store wanted it back,
// the record goes and OnRefetched hears of it.
func (s *Store) refetched(e Entry) {
	s.mu.Lock()
	was := s.wanted[e.ID]
	s.mu.Unlock()
	if !was {
		return
	}
	if err := s.Unwant(e.ID); err != nil {
		return // loadWanted drops it at the next start
	}
	if s.opt.OnRefetched != nil {
		s.opt.OnRefetched(e)
	}
}

// wantDropped records the entries the start-up check dropped (quarantined,
// or their file or pack gone) as wanted, in tx.
func wantDropped(tx *bolt.Tx, entries []Entry, dropped map[string]bool, now time.Time) error {
	for _, e := range entries {
		if dropped[e.ID] {
			if err := putWanted(tx, e, now); err != nil {
				return err
			}
		}
	}
	return nil
}
