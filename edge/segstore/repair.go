package segstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// QuarantineDir is the directory, beside segments/, that damaged segment
// files are moved to. Nothing reads it: its files are not served, not
// counted against the quota, and never deleted by edged.
const QuarantineDir = "quarantine"

// How an index entry was rebuilt (Entry.Rebuilt).
const (
	// RebuiltFromTag: the file's content matched its digest tag, the copy
	// of the digest the commit path verified. As trustworthy as an entry
	// written by a receive.
	RebuiltFromTag = "tag"
	// RebuiltFromContent: the file had no tag (a file system without
	// extended attributes, or written by an edged older than tags); its
	// digest is that of its content now. See docs/edge.md for why this is
	// still safe to relay.
	RebuiltFromContent = "content"
)

// Quarantined is a segment file moved, or a pack record copied, to
// QuarantineDir.
type Quarantined struct {
	ID     string // segment id
	File   string // name in QuarantineDir: <id>.<UTC time>
	Reason string
	Found  string // FoundAtStart or FoundOnRead
}

// When a damaged copy was found (Quarantined.Found).
const (
	FoundAtStart = "start" // the start-up check (Open)
	FoundOnRead  = "read"  // a Reader, reading it to send or verify
)

// hashFile reads path and returns its size and SHA-256 (lower-case hex).
func hashFile(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	return hashAll(f)
}

// hashAll reads r to its end and returns how many bytes it read and
// their SHA-256 (lower-case hex), the form of Entry.SHA256.
func hashAll(r io.Reader) (int64, string, error) { return hashBuf(r, nil) }

// hashBuf is hashAll copying through buf (nil: a new 32 KiB buffer per
// call, as io.Copy allocates for a reader such as a pack record's
// io.SectionReader). A loop over thousands of records passes one buffer:
// a rebuild of 10,000 pack records of 4 KiB allocated 290 MB in those
// buffers, and the process peaked at 43-50 MiB resident.
func hashBuf(r io.Reader, buf []byte) (int64, string, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(h, r, buf)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// quarantine is quarantineFile at start-up: the move is reported in the
// scan.
func (s *Store) quarantine(id, reason string) error {
	q, err := s.quarantineFile(id, reason)
	if err == nil {
		q.Found = FoundAtStart
		s.scan.Quarantined = append(s.scan.Quarantined, q)
	}
	return err
}

// quarantineFile moves segments/<id> into QuarantineDir under a name that
// says when, and makes the move durable (both directories fsynced) before
// the caller drops the index entry: a crash in between leaves an entry
// without its file, which the next start drops, never a damaged file under
// its id. An existing name is never overwritten.
func (s *Store) quarantineFile(id, reason string) (Quarantined, error) {
	qdir, name, err := s.quarantineName(id)
	if err != nil {
		return Quarantined{}, err
	}
	if err := os.Rename(filepath.Join(s.dir, id), filepath.Join(qdir, name)); err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: %w", id, err)
	}
	if err := syncDir(qdir); err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: fsync %s: %w", id, qdir, err)
	}
	if err := syncDir(s.dir); err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: fsync %s: %w", id, s.dir, err)
	}
	return Quarantined{ID: id, File: name, Reason: reason}, nil
}

// quarantineWith is quarantine for bytes that are not a file of their
// own (a pack record): fill writes them to a new file in QuarantineDir,
// which is fsynced, and its directory, before it returns. The copy is
// reported in the scan.
func (s *Store) quarantineWith(id, reason string, fill func(*os.File) error) error {
	q, err := s.quarantineCopy(id, reason, fill)
	if err == nil {
		q.Found = FoundAtStart
		s.scan.Quarantined = append(s.scan.Quarantined, q)
	}
	return err
}

// quarantineCopy is quarantineWith without the report.
func (s *Store) quarantineCopy(id, reason string, fill func(*os.File) error) (Quarantined, error) {
	qdir, name, err := s.quarantineName(id)
	if err != nil {
		return Quarantined{}, err
	}
	f, err := os.OpenFile(filepath.Join(qdir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: %w", id, err)
	}
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(qdir)
	}
	if err != nil {
		return Quarantined{}, fmt.Errorf("quarantine %s: %w", id, err)
	}
	return Quarantined{ID: id, File: name, Reason: reason}, nil
}

// quarantineName creates QuarantineDir if needed and picks a name in it
// for id that says when and is not taken.
func (s *Store) quarantineName(id string) (qdir, name string, err error) {
	qdir = filepath.Join(filepath.Dir(s.dir), QuarantineDir)
	if err := CreateDir(qdir, 0o700, s.opt.SyncDir); err != nil {
		return "", "", fmt.Errorf("quarantine %s: %w", id, err)
	}
	base := id + "." + s.opt.Now().UTC().Format("20060102T150405Z")
	name = base
	for i := 1; ; i++ {
		_, err := os.Lstat(filepath.Join(qdir, name))
		if errors.Is(err, os.ErrNotExist) {
			return qdir, name, nil
		}
		if err != nil {
			return "", "", fmt.Errorf("quarantine %s: %w", id, err)
		}
		name = fmt.Sprintf("%s-%d", base, i)
	}
}

// checkFiles is the start-up check of indexed files against their
// entries: a file of the wrong size (torn, or damaged) is quarantined, and
// with Options.VerifyOnOpen so is one whose content does not hash to the
// entry's digest. It returns the ids whose entries must be dropped.
func (s *Store) checkFiles(entries []Entry, sizes map[string]int64) ([]string, error) {
	var drop []string
	for _, e := range entries {
		size, ok := sizes[e.ID]
		if !ok {
			drop = append(drop, e.ID) // missing: nothing to quarantine
			continue
		}
		reason := ""
		switch {
		case size != e.Size:
			reason = fmt.Sprintf("file has %d bytes, index entry %d", size, e.Size)
		case s.opt.VerifyOnOpen:
			s.scan.Verified++
			_, got, err := hashFile(filepath.Join(s.dir, e.ID))
			switch {
			case err != nil:
				reason = fmt.Sprintf("unreadable: %v", err)
			case got != e.SHA256:
				reason = fmt.Sprintf("content sha256 %s, index entry %s", got, e.SHA256)
			}
		}
		if reason == "" {
			continue
		}
		if err := s.quarantine(e.ID, reason); err != nil {
			return nil, err
		}
		drop = append(drop, e.ID)
	}
	return drop, nil
}

// rebuild creates the index from the segment files and the packs'
// records, for a database that has no index (a new database, after a
// damaged one was set aside). Each file is hashed; one whose content does
// not match its digest tag, or that cannot be read, is quarantined; the
// others get an entry with their size, digest, the tag's source, the
// file's modification time as the received time, and Rebuilt saying
// where the digest came from (rebuildPacks does the same for records).
// An id found more than once (a segment evicted, the crash that lost the
// database came before its file or record was removed, and it was stored
// again) keeps the one received last; the other is removed with the
// rest of the debris. The bucket and every entry are created in one
// transaction, so a crash during the rebuild leaves no index and the next
// start rebuilds again (rather than taking the files for orphans of an
// empty index).
func (s *Store) rebuild(sizes, packs map[string]int64) error {
	entries, err := s.rebuildFiles(sizes)
	if err != nil {
		return err
	}
	packed, err := s.rebuildPacks(packs)
	if err != nil {
		return err
	}
	byID := map[string]Entry{}
	for _, e := range slices.Concat(entries, packed) {
		if old, ok := byID[e.ID]; !ok || e.Received.After(old.Received) {
			byID[e.ID] = e
		}
	}
	entries = slices.SortedFunc(maps.Values(byID), func(a, b Entry) int { return strings.Compare(a.ID, b.ID) })
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(indexBucket)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := putEntry(b, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild index: %w", err)
	}
	var live []Entry
	for _, e := range entries {
		s.bytes += e.Size
		s.count++
		s.scan.Rebuilt = append(s.scan.Rebuilt, e.ID)
		if e.Packed() {
			live = append(live, e)
		} else {
			delete(sizes, e.ID)
		}
	}
	for id := range sizes { // files that lost to a later record (quarantined ones are gone already)
		if err := os.Remove(filepath.Join(s.dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove superseded segment file: %w", err)
		}
	}
	return s.setupPacks(live, packs)
}

// rebuildFiles returns the entries of the segment files that check out
// against their tags, quarantining the others (see rebuild).
func (s *Store) rebuildFiles(sizes map[string]int64) ([]Entry, error) {
	var entries []Entry
	for _, id := range slices.Sorted(maps.Keys(sizes)) {
		path := filepath.Join(s.dir, id)
		s.scan.Verified++
		size, digest, err := hashFile(path)
		var fi os.FileInfo
		if err == nil {
			fi, err = os.Stat(path)
		}
		if err != nil {
			if err := s.quarantine(id, fmt.Sprintf("unreadable: %v", err)); err != nil {
				return nil, err
			}
			continue
		}
		e := Entry{ID: id, Size: size, SHA256: digest, Received: fi.ModTime().UTC(), Rebuilt: RebuiltFromTag}
		t, err := readTag(path)
		switch {
		case errors.Is(err, errNoTag):
			e.Rebuilt = RebuiltFromContent
			s.scan.Unverified = append(s.scan.Unverified, id)
		case err != nil:
			if err := s.quarantine(id, err.Error()); err != nil {
				return nil, err
			}
			continue
		case t.SHA256 != digest:
			if err := s.quarantine(id, fmt.Sprintf("content sha256 %s, digest tag %s", digest, t.SHA256)); err != nil {
				return nil, err
			}
			continue
		default:
			e.Source = t.Source
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// CheckIndex decodes every index entry in tx and checks what Open relies
// on (a valid id, a digest, a size ≥ 0), for the daemon's start-up check
// of the database. An index that does not exist is fine (it is rebuilt).
func CheckIndex(tx *bolt.Tx) error {
	b := tx.Bucket(indexBucket)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		id := string(k)
		if err := ValidID(id); err != nil {
			return fmt.Errorf("index entry %q: %w", k, err)
		}
		e, err := decodeEntry(id, v)
		if err != nil {
			return err
		}
		if _, err := normDigest(e.SHA256); err != nil || e.Size < 0 {
			return fmt.Errorf("index entry %s: size %d, sha256 %q", id, e.Size, e.SHA256)
		}
		if l := e.loc; l.pack != "" {
			if _, ok := packSeq(l.pack); !ok || l.off < 0 || l.off%recordAlign != 0 ||
				l.len != alignRecord(recordHeaderLen(id, e.Source)+e.Size) {
				return fmt.Errorf("index entry %s: record %d+%d of pack %q", id, l.off, l.len, l.pack)
			}
		}
		return nil
	})
}
