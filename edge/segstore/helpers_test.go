package segstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var testOpts = Options{QuotaBytes: 1 << 20, QuotaSegments: 16, MaxSegmentBytes: 256 << 10}

type fixture struct {
	dir string
	db  *bolt.DB
	s   *Store
}

// newStore opens a Store on real files in dir (t.TempDir() when empty)
// and checks the crash-safety invariant, and that no reservation leaked,
// when the test ends.
func newStore(t *testing.T, dir string, opt Options) *fixture {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, db, opt)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	f := &fixture{dir: dir, db: db, s: s}
	t.Cleanup(func() {
		// f's fields, not the locals: a test may reopen the store.
		checkInvariant(t, f)
		if u := f.s.Usage(); u.ReservedBytes != 0 || u.ReservedSegments != 0 || len(f.s.busy) != 0 {
			t.Errorf("reservations leaked: %+v busy %v", u, f.s.busy)
		}
		if err := f.db.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// checkInvariant is the package's crash-safety invariant: every index
// entry's file exists with the entry's size and digest; no temp files; no
// segment-named file without an entry; Usage agrees with the index.
func checkInvariant(t *testing.T, f *fixture) {
	t.Helper()
	entries, err := f.s.List()
	if err != nil {
		t.Fatal(err)
	}
	indexed := map[string]bool{}
	var bytes int64
	for _, e := range entries {
		indexed[e.ID] = true
		bytes += e.Size
		if err := f.s.Verify(e.ID); err != nil {
			t.Errorf("invariant: %v", err)
		}
	}
	des, err := os.ReadDir(filepath.Join(f.dir, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		switch name := de.Name(); {
		case strings.HasPrefix(name, tmpPrefix):
			t.Errorf("invariant: temp file %s left behind", name)
		case de.Type().IsRegular() && ValidID(name) == nil && !indexed[name]:
			t.Errorf("invariant: file %s has no index entry", name)
		}
	}
	if u := f.s.Usage(); u.Bytes != bytes || u.Segments != int64(len(entries)) {
		t.Errorf("invariant: usage %d bytes %d segments, index %d bytes %d segments", u.Bytes, u.Segments, bytes, len(entries))
	}
	checkPacks(t, f, entries)
}

// checkPacks is the invariant's part for packs: every byte of a pack that
// is not an indexed record is zero (evicted records are punched, a failed
// group's records cut off), the store's spans are the index's records,
// and no pack but the active one is without records.
func checkPacks(t *testing.T, f *fixture, entries []Entry) {
	t.Helper()
	spans := map[string][]location{}
	for _, e := range entries {
		if e.Packed() {
			spans[e.loc.pack] = append(spans[e.loc.pack], e.loc)
		}
	}
	des, err := os.ReadDir(filepath.Join(f.dir, packDirName))
	if err != nil {
		t.Fatal(err)
	}
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	for _, de := range des {
		name := de.Name()
		if _, ok := packSeq(name); !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(f.dir, packDirName, name))
		if err != nil {
			t.Fatal(err)
		}
		live := make([]bool, len(b))
		for _, l := range spans[name] {
			for i := l.off; i < l.off+l.len && i < int64(len(b)); i++ {
				live[i] = true
			}
		}
		for i, c := range b {
			if c != 0 && !live[i] {
				t.Errorf("invariant: pack %s byte %d is %#x outside any indexed record", name, i, c)
				break
			}
		}
		p := f.s.packs[name]
		active := f.s.writer != nil && f.s.writer.name == name
		switch {
		case p == nil:
			t.Errorf("invariant: pack %s on disk, not in the store", name)
		case len(p.spans) != len(spans[name]):
			t.Errorf("invariant: pack %s: store has %d spans, index %d records", name, len(p.spans), len(spans[name]))
		case len(p.spans) == 0 && !active:
			t.Errorf("invariant: sealed pack %s has no records", name)
		}
	}
}

func content(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func put(t *testing.T, s *Store, id string, b []byte) Entry {
	t.Helper()
	e, err := s.Write(id, int64(len(b)), digest(b), bytes.NewReader(b), "peer-x")
	if err != nil {
		t.Fatalf("write %s: %v", id, err)
	}
	return e
}

func read(t *testing.T, s *Store, id string) []byte {
	t.Helper()
	f, _, err := s.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// failReader fails the test if anything reads it.
type failReader struct{ t *testing.T }

func (r failReader) Read([]byte) (int, error) {
	r.t.Error("reader was read")
	return 0, io.EOF
}

// errReader yields n bytes, then err.
type errReader struct {
	n   int
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, r.err
	}
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}
