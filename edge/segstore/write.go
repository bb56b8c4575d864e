package segstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// Reservation holds quota for one segment being received, and the id
// against concurrent writers and evictions. Use it once: Write, or
// Release. Release after Write is a no-op, so `defer r.Release()` is the
// idiom.
type Reservation struct {
	s      *Store
	id     string
	size   int64
	digest string
	used   bool // Write or Release has run; guarded by s.mu
}

// Reserve admits an offer: it validates id, size and digest, and checks,
// in this order: already stored (ErrAlreadyHave when size and digest
// match, ErrDigestConflict otherwise), being written or evicted (ErrBusy),
// the maximum segment size (ErrTooLarge) and the quota counting other
// reservations (ErrQuota; with Options.MakeRoom, only if making room
// failed, see room.go). On success the space and the id are held until
// Write or Release. A segment that is already stored is recognised even
// when the quota is full, so a sender whose ACK was lost is re-ACKed.
func (s *Store) Reserve(id string, size int64, sha256hex string) (*Reservation, error) {
	r, err := s.reserve(id, size, sha256hex)
	if errors.Is(err, ErrQuota) && s.opt.MakeRoom != nil {
		s.makeRoom(size)
		r, err = s.reserve(id, size, sha256hex)
	}
	return r, err
}

func (s *Store) reserve(id string, size int64, sha256hex string) (*Reservation, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	digest, err := normDigest(sha256hex)
	if err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, fmt.Errorf("%w: size %d", ErrInvalid, size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Under s.mu: a concurrent Write of this id either committed its entry
	// (seen here) or still holds the id (ErrBusy below).
	if s.busy[id] {
		return nil, fmt.Errorf("reserve %s: %w", id, ErrBusy)
	}
	e, err := s.Stat(id)
	switch {
	case err == nil && e.SHA256 == digest && e.Size == size:
		return nil, fmt.Errorf("reserve %s: %w", id, ErrAlreadyHave)
	case err == nil:
		return nil, fmt.Errorf("reserve %s: %w: stored %d bytes sha256 %s, offered %d bytes sha256 %s",
			id, ErrDigestConflict, e.Size, e.SHA256, size, digest)
	case !errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("reserve %s: %w", id, err)
	}
	if err := s.allowLocked(size); err != nil {
		return nil, fmt.Errorf("reserve %s: %w", id, err)
	}
	s.busy[id] = true
	s.resBytes += size
	s.resCount++
	return &Reservation{s: s, id: id, size: size, digest: digest}, nil
}

// Release gives back the reservation's space and id. Idempotent, and a
// no-op after Write.
func (r *Reservation) Release() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.used {
		return
	}
	r.used = true
	s.unreserveLocked(r, false)
}

// unreserveLocked returns r's space and id; committed moves the space to
// stored.
func (s *Store) unreserveLocked(r *Reservation, committed bool) {
	s.resBytes -= r.size
	s.resCount--
	delete(s.busy, r.id)
	if committed {
		s.bytes += r.size
		s.count++
	}
}

// Write streams the segment from src, verifies it against the reserved
// size and digest, and commits it (see the package documentation for the
// exact sequence). It reads at most size+1 bytes from src (the extra byte
// detects an over-long stream). On nil the segment is durable and
// indexed and the receiver may ACK. On error nothing of the attempt is
// left on disk or in the index: ErrSize and ErrChecksum for bad content,
// other errors for local I/O failures. Either way the reservation is used
// up; a retry needs a new Reserve.
func (r *Reservation) Write(src io.Reader, source string) (Entry, error) {
	s := r.s
	s.mu.Lock()
	used := r.used
	r.used = true
	s.mu.Unlock()
	if used {
		return Entry{}, ErrReservationUsed
	}
	committed := false
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.unreserveLocked(r, committed)
	}()
	e, err := s.commit(r.id, r.size, r.digest, src, source)
	if err != nil {
		err = s.diskFull(err, r.size) // room.go
		return Entry{}, fmt.Errorf("write segment %s: %w", r.id, err)
	}
	committed = true
	return e, nil
}

// Write is Reserve followed by Reservation.Write, for callers that have
// the content at hand (local ingest). When the segment is already stored
// with the same digest it returns the stored entry and ErrAlreadyHave,
// without reading src.
func (s *Store) Write(id string, size int64, sha256hex string, src io.Reader, source string) (Entry, error) {
	r, err := s.Reserve(id, size, sha256hex)
	if errors.Is(err, ErrAlreadyHave) {
		e, serr := s.Stat(id)
		if serr != nil {
			return Entry{}, serr
		}
		return e, err
	}
	if err != nil {
		return Entry{}, err
	}
	defer r.Release()
	return r.Write(src, source)
}

// commit is the crash-safe commit path. The id is held (busy) by the
// caller's reservation, so no one else creates or removes its file or
// entry meanwhile.
func (s *Store) commit(id string, size int64, digest string, src io.Reader, source string) (_ Entry, err error) {
	final := filepath.Join(s.dir, id)
	f, err := os.CreateTemp(s.dir, tmpPrefix+id+"-*")
	if err != nil {
		return Entry{}, err
	}
	tmp := f.Name()
	tagFile(tmp, digest, source) // before any byte: see tag.go
	renamed := false
	defer func() {
		if err == nil {
			return
		}
		if f != nil {
			f.Close()
		}
		// Remove what this attempt created; the startup scan is the
		// backstop if removal fails or the process dies first.
		if renamed {
			os.Remove(final)
		} else {
			os.Remove(tmp)
		}
	}()
	if err := s.hit(stepCreated); err != nil {
		return Entry{}, err
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	n, err := io.CopyBuffer(io.MultiWriter(s.tempWriter(id, f), h), io.LimitReader(src, size+1), buf)
	if err != nil {
		return Entry{}, fmt.Errorf("receive: %w", err)
	}
	if n != size {
		if n > size {
			return Entry{}, fmt.Errorf("%w: stream longer than %d bytes", ErrSize, size)
		}
		return Entry{}, fmt.Errorf("%w: got %d of %d bytes", ErrSize, n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return Entry{}, fmt.Errorf("%w: content sha256 %s, offered %s", ErrChecksum, got, digest)
	}
	if err := s.hit(stepCopied); err != nil {
		return Entry{}, err
	}
	if err := f.Sync(); err != nil {
		return Entry{}, fmt.Errorf("fsync: %w", err)
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return Entry{}, fmt.Errorf("close: %w", cerr)
	}
	if err := s.hit(stepSynced); err != nil {
		return Entry{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Entry{}, fmt.Errorf("rename: %w", err)
	}
	renamed = true
	if err := s.hit(stepRenamed); err != nil {
		return Entry{}, err
	}
	if err := syncDir(s.dir); err != nil {
		return Entry{}, fmt.Errorf("fsync dir: %w", err)
	}
	if err := s.hit(stepDirSync); err != nil {
		return Entry{}, err
	}
	e := Entry{ID: id, Size: size, SHA256: digest, Received: s.opt.Now().UTC(), Source: source}
	v, err := e.encode()
	if err != nil {
		return Entry{}, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(indexBucket)
		if b.Get([]byte(id)) != nil {
			// Cannot happen while the id is held; refuse rather than
			// overwrite an entry whose file we just replaced.
			return fmt.Errorf("index entry for %s appeared during write", id)
		}
		return b.Put([]byte(id), v)
	})
	if err != nil {
		return Entry{}, fmt.Errorf("index: %w", err)
	}
	// Committed and durable: past this point the write succeeds, so the
	// hook only marks the point for crash tests and cannot fail it.
	_ = s.hit(stepIndexed)
	return e, nil
}

// Evict deletes a stored segment unconditionally (operator action) and
// frees its quota. ErrNotFound if absent, ErrBusy while it is being
// written or evicted.
func (s *Store) Evict(id string) error {
	return s.EvictIf(id, nil)
}

// EvictIf deletes a stored segment if gate, run inside the bbolt
// transaction that deletes the index entry, returns nil; gate's error is
// returned (wrapped) and nothing changes. Use ledger.EvictionGate as the
// gate so that the relay ledger is checked atomically with the deletion
// (the ledger must share this Store's *bolt.DB). The index entry goes
// first and the file second: a crash in between leaves an orphan file,
// which the next Open removes, never an entry without its file.
func (s *Store) EvictIf(id string, gate func(tx *bolt.Tx) error) error {
	s.mu.Lock()
	if s.busy[id] {
		s.mu.Unlock()
		return fmt.Errorf("evict %s: %w", id, ErrBusy)
	}
	s.busy[id] = true
	s.mu.Unlock()
	var size int64
	evicted := false
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.busy, id)
		if evicted {
			s.bytes -= size
			s.count--
		}
	}()
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(indexBucket)
		v := b.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		e, err := decodeEntry(id, v)
		if err != nil {
			return err
		}
		if gate != nil {
			if err := gate(tx); err != nil {
				return err
			}
		}
		size = e.Size
		return b.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	evicted = true
	if err := s.hit(stepUnindex); err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	if err := os.Remove(filepath.Join(s.dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("evict %s: index entry removed, file left for the next start-up scan: %w", id, err)
	}
	if err := s.hit(stepUnlinked); err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("evict %s: fsync dir: %w", id, err)
	}
	return nil
}

// Verify re-reads a stored segment and checks its size and digest against
// the index (for operators and tests; the commit path verified it once).
func (s *Store) Verify(id string) error {
	f, e, err := s.Open(id)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	if n != e.Size {
		return fmt.Errorf("verify %s: %w: file has %d bytes, index %d", id, ErrSize, n, e.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != e.SHA256 {
		return fmt.Errorf("verify %s: %w: file sha256 %s, index %s", id, ErrChecksum, got, e.SHA256)
	}
	return nil
}
