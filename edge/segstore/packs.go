package segstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Packs: small segments several to a file.
//
// Creating a file is the dearest part of storing a small segment: on the
// project's test machine (ext4) an empty file's creation costs 300-700 µs
// of CPU, against 4 µs to append 4 KiB to an open one, and a file per
// segment capped a receiver at a few thousand small segments a second. So
// a segment of at most Options.PackMaxBytes is kept in memory between
// Receive and Commit, and its group's leader appends it, as a
// self-describing record (packrecord.go), to the store's active pack
// file, <dir>/packs/<16 digits>.pack. The commit's contract and order are
// a segment file's: the record is verified before it is written, durable
// (the group's syncfs, or an fsync of the pack) before the index entry
// that names it (pack, offset, length) commits, and only then may the
// receiver ACK. A record without an entry was never acknowledged.
//
// Eviction zeroes the record and returns its blocks to the file system
// (fallocate PUNCH_HOLE, together with the dead space around it, so that
// blocks shared with evicted neighbours are freed too), and a sealed
// pack whose last record goes is removed. Packs are used only where hole
// punching works (probed at Open): without it evicted bytes would stay on
// disk. A record being read is not punched until its last reader closes.
//
// Start-up repair follows from the index being the commit point: each
// pack is cut back to the end of its last indexed record and every byte
// between indexed records is punched (records of groups that never
// committed, evictions a crash interrupted); a pack without indexed
// records is removed. A rebuild (no index) reads the records back, as
// the digest tags of segment files: see rebuildPacks.
//
// Packs are never appended to after a restart: Open seals them all and the
// first group creates a new one, so a torn tail is never followed by live
// records.
const (
	packDirName = "packs"
	packSuffix  = ".pack"
	// packFileBytes seals the active pack once it holds this much.
	packFileBytes = 64 << 20
	// DefaultPackMaxBytes is the daemon's default Options.PackMaxBytes.
	DefaultPackMaxBytes = 64 << 10
)

// location is where a packed segment's record is: pack "" means the
// segment is a file of its own.
type location struct {
	pack     string
	off, len int64 // the record, header and padding included
}

// span is an indexed record of a pack.
type span struct {
	off, len int64
	readers  int  // open Readers
	dead     bool // evicted while being read: punched when the last reader closes
}

// pack is a pack file's state, under Store.mu.
type pack struct {
	name    string
	spans   []span // sorted by off
	indexed int64  // every byte below is an indexed record or dead space
	sealed  bool   // no more appends: removed once its last span goes
}

func (p *pack) find(off int64) (int, bool) {
	return slices.BinarySearchFunc(p.spans, off, func(s span, off int64) int {
		switch {
		case s.off < off:
			return -1
		case s.off > off:
			return 1
		}
		return 0
	})
}

// deadAround is the range to punch for the span at i, about to be
// removed: from the end of the previous span (or 0) to the start of the
// next one (or the indexed end), so that blocks the record shares with
// evicted neighbours are freed as well.
func (p *pack) deadAround(i int) (int64, int64) {
	lo, hi := int64(0), p.indexed
	if i > 0 {
		lo = p.spans[i-1].off + p.spans[i-1].len
	}
	if i+1 < len(p.spans) {
		hi = p.spans[i+1].off
	}
	return lo, hi
}

// packWriter is the active pack, used only by the group commit's leader.
type packWriter struct {
	f    *os.File
	name string
	end  int64
	// created is set when the file was created and its directory entry is
	// not durable yet: the group fsyncs packs/ before its index commit.
	created bool
}

func (s *Store) packDir() string { return filepath.Join(filepath.Dir(s.dir), packDirName) }

func packName(seq uint64) string { return fmt.Sprintf("%016d%s", seq, packSuffix) }

// packSeq parses a pack file name; ok is false for anything else.
func packSeq(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, packSuffix)
	if !ok || len(digits) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	return n, err == nil
}

// goesInPack reports whether a segment of size goes into a pack.
func (s *Store) goesInPack(size int64) bool { return s.packing && size <= s.opt.PackMaxBytes }

// packable reports whether Receive reads a segment of size into memory
// for a pack, and if so takes its bytes from the receive memory budget
// (given back by unstage); when the budget is in use, it goes through a
// temp file as a large one does.
func (s *Store) packable(size int64) bool {
	return s.goesInPack(size) && s.mem.tryTake(size)
}

func (s *Store) unstage(size int64) { s.mem.give(size) }

// groupPack returns the pack a group appends to: the active one, or a
// new one when there is none or it is full. A group appends to one pack
// only (it may take a pack past packFileBytes by at most its own size,
// bounded by the receive memory budget), so it has one file to sync and one to cut back
// when it fails.
func (s *Store) groupPack() (*packWriter, error) {
	if w := s.writer; w != nil && w.end < packFileBytes {
		return w, nil
	}
	if w := s.writer; w != nil {
		s.sealPack(w)
		s.writer = nil
	}
	s.mu.Lock()
	seq := s.nextPack
	s.nextPack++
	s.mu.Unlock()
	name := packName(seq)
	f, err := os.OpenFile(filepath.Join(s.packDir(), name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create pack: %w", err)
	}
	s.mu.Lock()
	s.packs[name] = &pack{name: name}
	s.mu.Unlock()
	s.writer = &packWriter{f: f, name: name, created: true}
	return s.writer, nil
}

// sealPack stops appends to w's pack, and removes it if nothing in it is
// indexed.
func (s *Store) sealPack(w *packWriter) {
	w.f.Close()
	s.mu.Lock()
	p := s.packs[w.name]
	p.sealed = true
	empty := len(p.spans) == 0
	if empty {
		delete(s.packs, w.name)
	}
	s.mu.Unlock()
	if empty {
		os.Remove(filepath.Join(s.packDir(), w.name))
	}
}

// appendPacked writes the records of a group's packed requests to w, one
// write each (through Options.WrapTemp, for fault tests), and returns
// those written. A request whose write fails gets its err and the pack is
// cut back to where its record started, so the next record follows the
// last good one.
func (s *Store) appendPacked(w *packWriter, reqs []*commitReq) []*commitReq {
	var written []*commitReq
	for _, r := range reqs {
		rec := r.rec
		if rec != nil {
			putRecordHeader(rec, r.entry, int64(len(r.data)))
		} else {
			rec = encodeRecord(r.entry, r.data)
		}
		if _, err := s.tempWriter(r.entry.ID, io.NewOffsetWriter(w.f, w.end)).Write(rec); err != nil {
			r.err = fmt.Errorf("append to pack %s: %w", w.name, err)
			s.cutPack(w, w.end)
			if s.writer == nil {
				// The cut failed and sealed the pack: the rest fail too.
				for _, r := range reqs[len(written)+1:] {
					if r.err == nil {
						r.err = fmt.Errorf("append to pack %s: pack sealed after a failed write", w.name)
					}
				}
				return written
			}
			continue
		}
		r.entry.loc = location{pack: w.name, off: w.end, len: int64(len(rec))}
		w.end += int64(len(rec))
		written = append(written, r)
	}
	return written
}

// cutPack truncates w's pack back to end (undoing records that will not
// be indexed). If that fails the pack is sealed: its tail stays garbage
// until the next start cuts it, and the next group starts a new pack.
func (s *Store) cutPack(w *packWriter, end int64) {
	if err := w.f.Truncate(end); err != nil {
		if s.writer == w {
			s.sealPack(w)
			s.writer = nil
		}
		return
	}
	w.end = end
}

// addSpans records a group's records as spans of w's pack, right before
// their index entries commit: a reader that finds an entry must find its
// span (Open), and an eviction of a neighbour must not punch a record
// whose entry is being committed. dropSpans undoes it if the commit fails.
func (s *Store) addSpans(w *packWriter, reqs []*commitReq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.packs[w.name]
	for _, r := range reqs {
		p.spans = append(p.spans, span{off: r.entry.loc.off, len: r.entry.loc.len})
	}
	p.indexed = w.end
}

// dropSpans removes the spans of records whose index entries did not
// commit, from the end of the pack's span list (they were added last);
// their bytes are cut or punched by the caller or the next start.
func (s *Store) dropSpans(w *packWriter, reqs []*commitReq, indexed int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.packs[w.name]
	for _, r := range reqs {
		if i, ok := p.find(r.entry.loc.off); ok {
			p.spans = slices.Delete(p.spans, i, i+1)
		}
	}
	p.indexed = indexed
}

// syncPackDir makes a new pack's directory entry durable, before any
// index entry names the pack.
func (s *Store) syncPackDir(w *packWriter) error {
	if !w.created {
		return nil
	}
	if err := syncDir(s.packDir()); err != nil {
		return fmt.Errorf("fsync %s: %w", s.packDir(), err)
	}
	w.created = false
	return nil
}

// Reader reads one stored segment: a segment file, or a record's content
// in a pack. While it is open an eviction does not zero a packed record
// (a segment file, as any, stays readable after its unlink).
type Reader struct {
	*io.SectionReader
	f       *os.File
	release func()
	v       *verifier // nil once a Seek left the start (verify.go)
}

// Close closes the reader.
func (r *Reader) Close() error {
	err := r.f.Close()
	if r.release != nil {
		r.release()
		r.release = nil
	}
	return err
}

// openPacked opens e's record for reading; it runs under s.mu, right
// after the index said e is stored, so an eviction either came before
// (the entry is gone) or finds the reader and defers its punch.
func (s *Store) openPackedLocked(e Entry) (*Reader, error) {
	p := s.packs[e.loc.pack]
	i, ok := -1, false
	if p != nil {
		i, ok = p.find(e.loc.off)
	}
	if !ok {
		return nil, fmt.Errorf("open segment %s: index names record %d of pack %s, which is not indexed", e.ID, e.loc.off, e.loc.pack)
	}
	f, err := os.Open(filepath.Join(s.packDir(), e.loc.pack))
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", e.ID, err)
	}
	hl := recordHeaderLen(e.ID, e.Source)
	p.spans[i].readers++
	loc := e.loc
	return &Reader{SectionReader: io.NewSectionReader(f, loc.off+hl, e.Size), f: f, release: func() { s.unread(loc) }, v: newVerifier(s, e)}, nil
}

// unread is a Reader's Close of a packed record: the last reader of an
// evicted record punches it.
func (s *Store) unread(loc location) {
	s.mu.Lock()
	p := s.packs[loc.pack]
	i, _ := p.find(loc.off)
	p.spans[i].readers--
	var punch func()
	if p.spans[i].readers == 0 && p.spans[i].dead {
		punch = s.dropSpanLocked(p, i)
	}
	s.mu.Unlock()
	if punch != nil {
		punch()
	}
}

// evictPacked removes an evicted entry's span (its index entry is gone)
// and punches its record, or leaves that to its last reader.
func (s *Store) evictPacked(loc location) {
	s.mu.Lock()
	p := s.packs[loc.pack]
	var punch func()
	if p != nil {
		if i, ok := p.find(loc.off); ok {
			if p.spans[i].readers > 0 {
				p.spans[i].dead = true
			} else {
				punch = s.dropSpanLocked(p, i)
			}
		}
	}
	s.mu.Unlock()
	if punch != nil {
		punch()
	}
}

// dropSpanLocked removes span i of p and returns what to do without the
// lock: punch the dead range around it, or remove the pack if it was
// sealed and this was its last span. Punching is best effort: a range
// left unpunched (an error, a crash) is punched at the next start.
func (s *Store) dropSpanLocked(p *pack, i int) func() {
	lo, hi := p.deadAround(i)
	p.spans = slices.Delete(p.spans, i, i+1)
	path := filepath.Join(s.packDir(), p.name)
	if p.sealed && len(p.spans) == 0 {
		delete(s.packs, p.name)
		return func() { os.Remove(path) }
	}
	return func() {
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			punchHole(f, lo, hi-lo)
			f.Close()
		}
	}
}

// errPackUnsupported means the file system cannot punch holes.
var errPackUnsupported = errors.New("file system cannot punch holes: small segments are stored one file each")

// PackStats describes the pack files, for operators (edgectl storage,
// metrics): whether new small segments are packed, and how much disk the
// packs take against what their live records need.
type PackStats struct {
	Packing bool // new segments of at most MaxBytes go into packs
	// MaxBytes is Options.PackMaxBytes.
	MaxBytes int64
	// Files are the pack files; Records the indexed records in them (the
	// packed segments) and RecordBytes their length, headers and padding
	// included.
	Files       int
	Records     int
	RecordBytes int64
	// DiskBytes is what the pack files take on disk (allocated blocks
	// where the platform tells them, else their sizes). Above RecordBytes
	// by part-used blocks, records a reader still holds after their
	// eviction, and, on a running agent, records of a group whose index
	// commit failed (cut back at the next start).
	DiskBytes int64
}

// PackStats returns the packs' current figures.
func (s *Store) PackStats() PackStats {
	st := PackStats{Packing: s.packing, MaxBytes: s.opt.PackMaxBytes}
	s.mu.Lock()
	names := make([]string, 0, len(s.packs))
	for name, p := range s.packs {
		names = append(names, name)
		for _, sp := range p.spans {
			if !sp.dead {
				st.Records++
				st.RecordBytes += sp.len
			}
		}
	}
	s.mu.Unlock()
	for _, name := range names {
		if fi, err := os.Stat(filepath.Join(s.packDir(), name)); err == nil {
			st.Files++
			st.DiskBytes += allocated(fi)
		}
	}
	return st
}
