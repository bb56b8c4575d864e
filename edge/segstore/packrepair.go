package segstore

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Start-up repair of packs (see packs.go for the rules).

const probePrefix = ".probe-"

// probePunch reports whether dir's file system punches holes, on a
// scratch file it removes.
func probePunch(dir string) error {
	f, err := os.CreateTemp(dir, probePrefix)
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(make([]byte, 8192)); err != nil {
		return err
	}
	return punchHole(f, 0, 4096)
}

// listPacks returns the sizes of the pack files, removes a probe's
// leftover and reports anything else as unknown.
func (s *Store) listPacks() (map[string]int64, error) {
	des, err := os.ReadDir(s.packDir())
	if err != nil {
		return nil, err
	}
	packs := map[string]int64{}
	for _, de := range des {
		name := de.Name()
		seq, ok := packSeq(name)
		switch {
		case ok && de.Type().IsRegular():
			fi, err := de.Info()
			if err != nil {
				return nil, err
			}
			packs[name] = fi.Size()
			s.nextPack = max(s.nextPack, seq+1)
		case strings.HasPrefix(name, probePrefix):
			os.Remove(filepath.Join(s.packDir(), name))
		default:
			s.scan.Unknown = append(s.scan.Unknown, packDirName+"/"+name)
		}
	}
	return packs, nil
}

// checkPacked is checkFiles for packed entries: an entry whose pack is
// missing is dropped; one whose record is cut short, or whose header does
// not name it, or (Options.VerifyOnOpen) whose content does not hash to
// its digest, is quarantined and dropped. It returns the ids to drop.
func (s *Store) checkPacked(entries []Entry, packs map[string]int64) ([]string, error) {
	var drop []string
	open := map[string]*os.File{} // each pack opened once, not once per record
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	for _, e := range entries {
		size, ok := packs[e.loc.pack]
		if !ok {
			drop = append(drop, e.ID)
			continue
		}
		f := open[e.loc.pack]
		if f == nil {
			var err error
			if f, err = os.Open(filepath.Join(s.packDir(), e.loc.pack)); err != nil {
				return nil, fmt.Errorf("check pack %s: %w", e.loc.pack, err)
			}
			open[e.loc.pack] = f
		}
		reason := s.checkRecord(f, e, size)
		if reason == "" {
			continue
		}
		if err := s.quarantinePacked(e.ID, e.loc, reason); err != nil {
			return nil, err
		}
		drop = append(drop, e.ID)
	}
	return drop, nil
}

// checkRecord returns why e's record in f, its pack, is damaged, or "".
func (s *Store) checkRecord(f io.ReaderAt, e Entry, packSize int64) string {
	if e.loc.off+e.loc.len > packSize {
		return fmt.Sprintf("pack %s has %d bytes, record ends at %d", e.loc.pack, packSize, e.loc.off+e.loc.len)
	}
	h, err := readRecordHeader(f, e.loc.off)
	switch {
	case err != nil:
		return fmt.Sprintf("record header: %v", err)
	case h.id != e.ID || h.sha256 != e.SHA256 || h.size != e.Size || h.recordLen() != e.loc.len:
		return fmt.Sprintf("record header names %s (%d bytes, sha256 %s), index entry %s (%d bytes, sha256 %s)",
			h.id, h.size, h.sha256, e.ID, e.Size, e.SHA256)
	case !s.opt.VerifyOnOpen:
		return ""
	}
	s.scan.Verified++
	_, got, err := hashAll(io.NewSectionReader(f, e.loc.off+h.headerLen, e.Size))
	switch {
	case err != nil:
		return fmt.Sprintf("unreadable: %v", err)
	case got != e.SHA256:
		return fmt.Sprintf("content sha256 %s, index entry %s", got, e.SHA256)
	}
	return ""
}

// quarantinePacked copies a damaged record (header, content and all, as
// far as the pack holds it) to QuarantineDir and makes the copy durable
// before the caller drops its entry; the record itself is punched with
// the rest of the pack's dead space afterwards. Nothing is lost: a crash
// before the entry is dropped quarantines it again at the next start.
func (s *Store) quarantinePacked(id string, loc location, reason string) error {
	q, err := s.quarantineRecord(id, loc, reason)
	if err == nil {
		q.Found = FoundAtStart
		s.scan.Quarantined = append(s.scan.Quarantined, q)
	}
	return err
}

// quarantineRecord is quarantinePacked without the report.
func (s *Store) quarantineRecord(id string, loc location, reason string) (Quarantined, error) {
	src, err := os.Open(filepath.Join(s.packDir(), loc.pack))
	if err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: %w", id, err)
	}
	defer src.Close()
	return s.quarantineCopy(id, reason+fmt.Sprintf(" (record at %d of pack %s)", loc.off, loc.pack), func(dst *os.File) error {
		_, err := io.Copy(dst, io.NewSectionReader(src, loc.off, loc.len))
		return err
	})
}

// setupPacks builds the packs' state from their indexed entries, cuts
// each pack back to the end of its last record, punches the space
// between records, and removes packs without any. All packs are sealed.
func (s *Store) setupPacks(entries []Entry, packs map[string]int64) error {
	for name := range packs {
		s.packs[name] = &pack{name: name, sealed: true}
	}
	for _, e := range entries {
		if p := s.packs[e.loc.pack]; p != nil {
			p.spans = append(p.spans, span{off: e.loc.off, len: e.loc.len})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(packs)) {
		p := s.packs[name]
		path := filepath.Join(s.packDir(), name)
		if len(p.spans) == 0 {
			delete(s.packs, name)
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("remove empty pack: %w", err)
			}
			continue
		}
		slices.SortFunc(p.spans, func(a, b span) int { return int(a.off - b.off) })
		last := p.spans[len(p.spans)-1]
		p.indexed = last.off + last.len
		if err := s.tidyPack(path, p, packs[name]); err != nil {
			return err
		}
	}
	return nil
}

// tidyPack truncates a pack to its indexed end and punches every gap
// between its records (records never indexed, evictions not punched).
func (s *Store) tidyPack(path string, p *pack, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("tidy pack %s: %w", p.name, err)
	}
	defer f.Close()
	if size > p.indexed {
		if err := f.Truncate(p.indexed); err != nil {
			return fmt.Errorf("tidy pack %s: %w", p.name, err)
		}
	}
	var at int64
	for _, sp := range p.spans {
		if sp.off > at {
			// A file system that cannot punch (the store was moved to
			// one) leaves the dead bytes in place: the index still
			// decides what is stored, and no new packs are made there.
			if err := punchHole(f, at, sp.off-at); err != nil && !errors.Is(err, errPackUnsupported) && !errors.Is(err, errors.ErrUnsupported) {
				return fmt.Errorf("tidy pack %s: punch: %w", p.name, err)
			}
		}
		at = sp.off + sp.len
	}
	return nil
}

// rebuildPacks reads every pack's records back for a rebuild of the index
// (see rebuild): a record whose content hashes to its header's digest
// gets an entry (RebuiltFromTag: the header is the digest the commit path
// verified); one that does not is quarantined. Zero bytes (punched
// records) are stepped over; anything else that is not a record header
// ends the pack: the rest is a write a crash cut short, and is
// quarantined whole and cut off.
func (s *Store) rebuildPacks(packs map[string]int64) ([]Entry, error) {
	var out []Entry
	for _, name := range slices.Sorted(maps.Keys(packs)) {
		es, err := s.rebuildPack(name, packs[name])
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	return out, nil
}

func (s *Store) rebuildPack(name string, size int64) ([]Entry, error) {
	f, err := os.Open(filepath.Join(s.packDir(), name))
	if err != nil {
		return nil, fmt.Errorf("rebuild from pack %s: %w", name, err)
	}
	defer f.Close()
	var out []Entry
	buf := make([]byte, 32<<10)
	err = walkPack(f, size, func(off int64, h recordHeader) error {
		loc := location{pack: name, off: off, len: h.recordLen()}
		s.scan.Verified++
		_, got, err := hashBuf(io.NewSectionReader(f, loc.off+h.headerLen, h.size), buf)
		if err == nil && got != h.sha256 {
			err = fmt.Errorf("content sha256 %s, record header %s", got, h.sha256)
		}
		if err != nil {
			return s.quarantinePacked(h.id, loc, err.Error())
		}
		out = append(out, Entry{ID: h.id, Size: h.size, SHA256: h.sha256, Received: h.received, Source: h.source,
			Rebuilt: RebuiltFromTag, loc: loc})
		return nil
	}, func(off int64, why error) error {
		return s.quarantineTail(name, off, size, why.Error())
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild from pack %s: %w", name, err)
	}
	return out, nil
}

// walkPack calls rec for each record of the pack f (size bytes long), in
// order, stepping over zeros (evicted records, padding). At bytes that are
// neither zero nor a whole record it calls torn with why, and stops. An
// error from rec or torn stops the walk and is returned.
func walkPack(f *os.File, size int64, rec func(off int64, h recordHeader) error, torn func(off int64, why error) error) error {
	buf := make([]byte, maxRecordHeader)
	for off := int64(0); off < size; {
		n, err := f.ReadAt(buf, off)
		if n == 0 && err != nil {
			return err
		}
		if allZero(buf[:min(n, recordAlign)]) {
			off = nextNonZero(f, off, size)
			continue
		}
		h, err := parseRecordHeader(buf[:n])
		if err == nil && off+h.recordLen() > size {
			err = fmt.Errorf("record of %d bytes at %d runs past the end of the pack (%d bytes)", h.recordLen(), off, size)
		}
		if err != nil {
			return torn(off, err)
		}
		if err := rec(off, h); err != nil {
			return err
		}
		off += h.recordLen()
	}
	return nil
}

// quarantineTail copies a pack's bytes from off on (not a record: a torn
// write) to QuarantineDir and cuts them off the pack.
func (s *Store) quarantineTail(name string, off, size int64, reason string) error {
	path := filepath.Join(s.packDir(), name)
	src, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("quarantine tail of %s: %w", name, err)
	}
	defer src.Close()
	err = s.quarantineWith(strings.TrimSuffix(name, packSuffix)+".pack-tail", fmt.Sprintf("pack %s from %d: %s", name, off, reason), func(dst *os.File) error {
		_, err := io.Copy(dst, io.NewSectionReader(src, off, size-off))
		return err
	})
	if err != nil {
		return err
	}
	if err := os.Truncate(path, off); err != nil {
		return fmt.Errorf("quarantine tail of %s: %w", name, err)
	}
	return nil
}

// nextNonZero returns the offset of the first 8-byte word at or after off
// that is not all zero (size if there is none), skipping holes without
// reading them: the space of evicted records.
func nextNonZero(f *os.File, off, size int64) int64 {
	buf := make([]byte, 4096)
	for off < size {
		switch d := seekData(f, off); {
		case d < 0:
			return size
		case d > off:
			off = alignRecord(d)
		}
		n, _ := f.ReadAt(buf, off)
		if n < recordAlign {
			return size
		}
		for i := 0; i+recordAlign <= n; i += recordAlign {
			if !allZero(buf[i : i+recordAlign]) {
				return off + int64(i)
			}
		}
		off += int64(n) / recordAlign * recordAlign
	}
	return size
}
