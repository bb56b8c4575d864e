package segstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/wire"
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
	source string // ReserveFrom's source; "" for Reserve
	used   bool   // Write or Release has run; guarded by s.mu
}

// reserved is what one source's reservations hold.
type reserved struct{ bytes, count int64 }

// Reserve admits an offer: it validates id, size and digest, and checks,
// in this order: already stored (ErrAlreadyHave when size and digest
// match, ErrDigestConflict otherwise), being written or evicted (ErrBusy),
// the maximum segment size (ErrTooLarge) and the quota counting other
// reservations (ErrQuota; with Options.MakeRoom, only if making room
// failed, see room.go). On success the space and the id are held until
// Write or Release. A segment that is already stored is recognised even
// when the quota is full, so a sender whose ACK was lost is re-ACKed.
func (s *Store) Reserve(id string, size int64, sha256hex string) (*Reservation, error) {
	return s.ReserveFrom("", id, size, sha256hex)
}

// ReserveFrom is Reserve for a segment offered by source (a peer's node
// id), whose reservations together are bounded by
// Options.SourceReserveBytes and SourceReserveSegments: checked after the
// maximum segment size and before the quota, so that a source over its
// share (ErrSourceShare) never makes MakeRoom evict anything. "" is no
// source (Reserve).
func (s *Store) ReserveFrom(source, id string, size int64, sha256hex string) (*Reservation, error) {
	r, err := s.reserve(source, id, size, sha256hex)
	if errors.Is(err, ErrQuota) && s.opt.MakeRoom != nil {
		s.makeRoom(size)
		r, err = s.reserve(source, id, size, sha256hex)
	}
	return r, err
}

func (s *Store) reserve(source, id string, size int64, sha256hex string) (*Reservation, error) {
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
	if s.tombs[id] {
		return nil, fmt.Errorf("reserve %s: %w", id, ErrEvicted)
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
	if size <= s.opt.MaxSegmentBytes {
		if err := s.shareLocked(source, size); err != nil {
			return nil, fmt.Errorf("reserve %s: %w", id, err)
		}
	}
	if err := s.allowLocked(size); err != nil {
		return nil, fmt.Errorf("reserve %s: %w", id, err)
	}
	s.busy[id] = true
	s.resBytes += size
	s.resCount++
	if source != "" {
		h := s.bySource[source]
		s.bySource[source] = reserved{bytes: h.bytes + size, count: h.count + 1}
	}
	return &Reservation{s: s, id: id, size: size, digest: digest, source: source}, nil
}

// shareLocked checks a reservation of size bytes against source's share
// (Options.SourceReserveBytes, SourceReserveSegments).
func (s *Store) shareLocked(source string, size int64) error {
	if source == "" {
		return nil
	}
	h := s.bySource[source]
	switch {
	case s.opt.SourceReserveBytes > 0 && h.bytes+size > s.opt.SourceReserveBytes:
		return fmt.Errorf("%w: %s holds %d bytes in unfinished segments, + %d > %d", ErrSourceShare, source, h.bytes, size, s.opt.SourceReserveBytes)
	case s.opt.SourceReserveSegments > 0 && h.count+1 > s.opt.SourceReserveSegments:
		return fmt.Errorf("%w: %s holds %d unfinished segments, limit %d", ErrSourceShare, source, h.count, s.opt.SourceReserveSegments)
	}
	return nil
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
	if r.source != "" {
		if h := s.bySource[r.source]; h.count <= 1 {
			delete(s.bySource, r.source)
		} else {
			s.bySource[r.source] = reserved{bytes: h.bytes - r.size, count: h.count - 1}
		}
	}
	delete(s.busy, r.id)
	if committed {
		s.bytes += r.size
		s.count++
	}
}

// Write streams the segment from src, verifies it against the reserved
// size and digest, and commits it (see the package documentation for the
// exact sequence): Receive, then Staged.Commit. It reads at most size+1
// bytes from src (the extra byte detects an over-long stream). On nil the
// segment is durable and indexed and the receiver may ACK. On error
// nothing of the attempt is left on disk or in the index: ErrSize and
// ErrChecksum for bad content, other errors for local I/O failures.
// Either way the reservation is used up; a retry needs a new Reserve.
func (r *Reservation) Write(src io.Reader, source string) (Entry, error) {
	st, err := r.Receive(src, source)
	if err != nil {
		return Entry{}, err
	}
	return st.Commit()
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

// Staged is a received segment whose bytes are verified in a temp file
// or held in memory, but not yet durable: Commit makes it so, Abort
// discards it. Exactly one of them must be called.
type Staged struct {
	r   *Reservation
	f   *os.File
	tmp string
	// data is a segment's content held in memory (no temp file), taken
	// from the receive memory budget: bound for a pack (pack), or read by
	// Stage for a segment file Commit writes. Stage leaves it unverified.
	data     []byte
	pack     bool
	verified bool
	// rec is the pack record data lies in (pack set): the group's leader
	// writes the header in front of it, so the content is not copied
	// again. held is the receive memory data's buffer took.
	rec    []byte
	held   int64
	source string
	done   bool
}

// Receive streams the segment from src into a temp file and verifies its
// size and digest (ErrSize, ErrChecksum), hashing on another goroutine
// while the bytes are copied. It does not fsync: Commit does, so a
// receiver can read the next segment while earlier ones are made durable
// (and their fsyncs, run concurrently, share the file system's journal
// commits). A segment bound for a pack is read into memory instead, when
// the receive memory budget has room for it. On error nothing is left and
// the reservation is used up.
func (r *Reservation) Receive(src io.Reader, source string) (_ *Staged, err error) {
	s := r.s
	if err := r.use(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.failed(&err)
		}
	}()
	if s.packable(r.size) {
		return r.receivePacked(src, source)
	}
	f, err := os.CreateTemp(s.dir, tmpPrefix+r.id+"-*")
	if err != nil {
		return nil, err
	}
	st := &Staged{r: r, f: f, tmp: f.Name(), source: source, verified: true}
	tagFile(st.tmp, r.digest, source) // before any byte: see tag.go
	defer func() {
		if err != nil {
			st.discard()
		}
	}()
	if err := s.hit(stepCreated); err != nil {
		return nil, err
	}
	wb := &writeBehind{f: f, window: s.writeBehind}
	n, sum, err := wire.CopyHashing(s.tempWriter(r.id, wb), io.LimitReader(src, r.size+1))
	if err := r.check(n, sum, err); err != nil {
		return nil, err
	}
	if err := s.hit(stepCopied); err != nil {
		return nil, err
	}
	return st, nil
}

// use marks the reservation used by a receive.
func (r *Reservation) use() error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.used {
		return ErrReservationUsed
	}
	r.used = true
	return nil
}

// failed gives back the reservation of a receive that failed with *err,
// and wraps *err.
func (r *Reservation) failed(err *error) {
	s := r.s
	s.mu.Lock()
	s.unreserveLocked(r, false)
	s.mu.Unlock()
	*err = fmt.Errorf("write segment %s: %w", r.id, s.diskFull(*err, r.size)) // room.go
}

// receivePacked is Receive for a segment bound for a pack: the content is
// read into memory (its bytes are taken from the receive memory budget)
// and verified there; the group's leader appends it to the pack at Commit.
func (r *Reservation) receivePacked(src io.Reader, source string) (_ *Staged, err error) {
	s := r.s
	defer func() {
		if err != nil {
			s.unstage(r.size)
		}
	}()
	st := r.buffer(source, true)
	n, err := readSegment(src, st.data)
	sum := sha256.Sum256(st.data)
	if err := r.check(n, sum[:], err); err != nil {
		return nil, err
	}
	if err := s.hit(stepCopied); err != nil {
		return nil, err
	}
	st.verified = true
	return st, nil
}

// buffer returns a Staged whose data is an empty buffer for r's content,
// the content of a pack record when pack is set. Its memory (held) is the
// size the caller took from the budget: the content's.
func (r *Reservation) buffer(source string, pack bool) *Staged {
	st := &Staged{r: r, pack: pack, held: r.s.mem.clamp(r.size), source: source}
	if !pack {
		st.data = make([]byte, r.size)
		return st
	}
	hl := recordHeaderLen(r.id, source)
	st.rec = make([]byte, alignRecord(hl+r.size))
	st.data = st.rec[hl : hl+r.size]
	return st
}

// Stage takes room for the segment in the receive memory budget
// (Options.ReceiveMemory), waiting while ctx allows for the budget to
// have it, and returns the Staged that Fill then reads the content into: a
// receiver that stages its small segments holds at most the budget in
// received data, whatever the number of connections, and a full budget
// slows the senders down (their bytes wait in the network) instead of
// growing the heap. The wait comes before any byte is read, so a caller
// can bound the transfer itself on its own. Nothing is hashed and no
// file is created until Commit, which verifies the digest (ErrChecksum)
// and writes the segment to a pack or to its own file, so that a reader
// staging segments leaves the CPU-heavy part to whoever commits. On error
// the reservation is used up.
func (r *Reservation) Stage(ctx context.Context, source string) (_ *Staged, err error) {
	s := r.s
	if err := r.use(); err != nil {
		return nil, err
	}
	if err := s.mem.take(ctx, s.mem.clamp(r.size)); err != nil {
		err = fmt.Errorf("receive memory: %w", err)
		r.failed(&err)
		return nil, err
	}
	return r.buffer(source, s.goesInPack(r.size)), nil
}

// Fill reads a staged segment's content from src: exactly the reserved
// size (ErrSize for a shorter or longer stream). On error the segment is
// aborted: its memory and reservation are given back.
func (st *Staged) Fill(src io.Reader) error {
	n, err := readSegment(src, st.data)
	if err == nil && n != st.r.size {
		err = st.r.check(n, nil, nil) // ErrSize
	} else if err != nil {
		err = fmt.Errorf("receive: %w", err)
	}
	if err != nil {
		st.Abort()
		return fmt.Errorf("write segment %s: %w", st.r.id, err)
	}
	return nil
}

// readSegment fills data from src, then reads once more to find the
// stream's end. n is the bytes src yielded: len(data)+1 when it holds
// more. src's errors are returned as they are, io.EOF (the stream's end)
// excepted: an io.ErrUnexpectedEOF from a SEGMENT whose sender went away
// is a failure.
func readSegment(src io.Reader, data []byte) (n int64, err error) {
	for n < int64(len(data)) {
		m, err := src.Read(data[n:])
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	var one [1]byte
	for {
		m, err := src.Read(one[:])
		if m > 0 {
			return n + 1, nil
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// check is Receive's verdict on a copy: n bytes with digest sum, or the
// copy's error.
func (r *Reservation) check(n int64, sum []byte, err error) error {
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	if n != r.size {
		if n > r.size {
			return fmt.Errorf("%w: stream longer than %d bytes", ErrSize, r.size)
		}
		return fmt.Errorf("%w: got %d of %d bytes", ErrSize, n, r.size)
	}
	if got := hex.EncodeToString(sum); got != r.digest {
		return fmt.Errorf("%w: content sha256 %s, offered %s", ErrChecksum, got, r.digest)
	}
	return nil
}

// discard closes and removes the temp file, or gives back a segment's
// receive memory.
func (st *Staged) discard() {
	if st.data != nil {
		st.r.s.unstage(st.held)
		st.data, st.rec = nil, nil
		return
	}
	if st.f != nil {
		st.f.Close()
		st.f = nil
	}
	os.Remove(st.tmp)
}

// Abort discards a staged segment and gives back its reservation.
// Idempotent, and a no-op after Commit.
func (st *Staged) Abort() {
	s := st.r.s
	s.mu.Lock()
	done := st.done
	st.done = true
	s.mu.Unlock()
	if done {
		return
	}
	st.discard()
	s.mu.Lock()
	s.unreserveLocked(st.r, false)
	s.mu.Unlock()
}

// Commit makes a staged segment durable and indexed: fsync the temp file,
// then, together with every other segment ready at that moment (group
// commit), rename into place, fsync the directory once and commit the
// index entries in one bbolt transaction. Where syncfs reports errors
// (Linux 5.8 and later) the file is not fsynced on its own: one syncfs
// before the group's renames makes every file's content durable. On nil the segment is durable
// and the receiver may ACK; on error nothing of it is left.
func (st *Staged) Commit() (Entry, error) {
	r, s := st.r, st.r.s
	s.mu.Lock()
	done := st.done
	st.done = true
	s.mu.Unlock()
	if done {
		return Entry{}, ErrReservationUsed
	}
	e, err := s.commitStaged(st)
	s.mu.Lock()
	s.unreserveLocked(r, err == nil)
	s.mu.Unlock()
	if err != nil {
		return Entry{}, fmt.Errorf("write segment %s: %w", r.id, s.diskFull(err, r.size))
	}
	s.refetched(e)
	if s.opt.OnCommit != nil {
		s.opt.OnCommit(e)
	}
	return e, nil
}

// writeFile writes a staged segment's content to its temp file and gives
// back its receive memory: the content is then a segment file's, as
// Receive leaves it.
func (st *Staged) writeFile() (err error) {
	r, s := st.r, st.r.s
	defer st.discard() // the memory, whatever happens
	f, err := os.CreateTemp(s.dir, tmpPrefix+r.id+"-*")
	if err != nil {
		return err
	}
	tagFile(f.Name(), r.digest, st.source) // before any byte: see tag.go
	if err := s.hit(stepCreated); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	wb := &writeBehind{f: f, window: s.writeBehind}
	if _, err := s.tempWriter(r.id, wb).Write(st.data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := s.hit(stepCopied); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	st.f, st.tmp = f, f.Name()
	return nil
}

// commitStaged is the crash-safe commit path after Receive. The id is
// held (busy) by the reservation, so no one else creates or removes its
// file or entry meanwhile.
func (s *Store) commitStaged(st *Staged) (Entry, error) {
	r := st.r
	e := Entry{ID: r.id, Size: r.size, SHA256: r.digest, Received: s.opt.Now().UTC(), Source: st.source}
	if !st.verified {
		sum := sha256.Sum256(st.data)
		if err := r.check(r.size, sum[:], nil); err != nil {
			st.discard()
			return Entry{}, err
		}
		st.verified = true
	}
	if st.data != nil && !st.pack {
		if err := st.writeFile(); err != nil {
			return Entry{}, err
		}
	}
	if st.data != nil {
		req := &commitReq{entry: e, data: st.data, rec: st.rec, wake: make(chan struct{}, 1)}
		err := s.group.commit(s, req)
		st.discard() // the budget; the bytes are in the pack now, or not wanted
		if err != nil {
			return Entry{}, err
		}
		return req.entry, nil
	}
	var err error
	if s.fsSync == nil {
		// Each file on its own; the fsyncs of concurrent commits run
		// together and share the file system's journal commits.
		if err = st.f.Sync(); err != nil {
			err = fmt.Errorf("fsync: %w", err)
		}
	}
	if err == nil {
		err = s.hit(stepSynced)
	}
	if cerr := st.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	st.f = nil
	if err != nil {
		os.Remove(st.tmp)
		return Entry{}, err
	}
	req := &commitReq{tmp: st.tmp, entry: e, wake: make(chan struct{}, 1)}
	if err := s.group.commit(s, req); err != nil {
		return Entry{}, err
	}
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
	var loc location
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
		size, loc = e.Size, e.loc
		return b.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	evicted = true
	if err := s.hit(stepUnindex); err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	if err := s.unlinkEvicted(id, loc); err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	return nil
}

// unlinkEvicted removes the content of a segment whose index entry is
// gone: its pack record punched (or left to its last reader), or its file
// removed and the directory fsynced. What an error or a crash leaves is an
// orphan, which the next Open removes.
func (s *Store) unlinkEvicted(id string, loc location) error {
	if loc.pack != "" {
		s.evictPacked(loc) // best effort: the next start punches what is left
		return s.hit(stepUnlinked)
	}
	if err := os.Remove(filepath.Join(s.dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("index entry removed, file left for the next start-up scan: %w", err)
	}
	if err := s.hit(stepUnlinked); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	return nil
}

// Verify re-reads a stored segment and checks its size and digest against
// the index (for operators and tests; the commit path verified it once).
// Unlike a Reader's verification it only reports: nothing is quarantined.
func (s *Store) Verify(id string) error {
	f, e, err := s.Open(id)
	if err != nil {
		return err
	}
	defer f.Close()
	f.v = nil // reports, does not quarantine
	n, got, err := hashAll(f)
	if err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	if n != e.Size {
		return fmt.Errorf("verify %s: %w: file has %d bytes, index %d", id, ErrSize, n, e.Size)
	}
	if got != e.SHA256 {
		return fmt.Errorf("verify %s: %w: file sha256 %s, index %s", id, ErrChecksum, got, e.SHA256)
	}
	return nil
}
