package segstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// reopen closes f's database and opens a new Store over the same files,
// with dbFile as the database (a new, empty file when it does not exist).
func reopen(t *testing.T, f *fixture, dbFile string, opt Options) ScanReport {
	t.Helper()
	must(t, f.db.Close())
	db, err := bolt.Open(filepath.Join(f.dir, dbFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.db = db
	s, err := Open(f.dir, db, opt)
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	return s.Recovered()
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	b := make([]byte, 1)
	if _, err := fh.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := fh.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// quarantined returns the content of the one quarantined file of id.
func quarantined(t *testing.T, f *fixture, rep ScanReport, id string) []byte {
	t.Helper()
	i := slices.IndexFunc(rep.Quarantined, func(q Quarantined) bool { return q.ID == id })
	if i < 0 {
		t.Fatalf("%s not quarantined: %+v", id, rep.Quarantined)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, QuarantineDir, rep.Quarantined[i].File))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyOnOpenQuarantines: a file whose bytes changed after the commit
// (same size) is found only by hashing; VerifyOnOpen quarantines it with
// its bytes intact, drops its entry and frees its quota. Without the
// option only the size is checked.
func TestVerifyOnOpenQuarantines(t *testing.T) {
	f := newStore(t, "", testOpts)
	good, bad := content(5000, 1), content(7000, 2)
	put(t, f.s, "good", good)
	put(t, f.s, "bad", bad)
	flipByte(t, filepath.Join(f.dir, "segments", "bad"), 4321)

	rep := reopen(t, f, "edged.db", testOpts)
	if len(rep.Quarantined) != 0 {
		t.Fatalf("without VerifyOnOpen: %+v", rep)
	}
	if err := f.s.Verify("bad"); !errors.Is(err, ErrChecksum) {
		t.Fatalf("Verify(bad) = %v", err)
	}

	opt := testOpts
	opt.VerifyOnOpen = true
	rep = reopen(t, f, "edged.db", opt)
	if !slices.Equal(rep.DroppedEntries, []string{"bad"}) || len(rep.Quarantined) != 1 {
		t.Fatalf("report %+v", rep)
	}
	want := slices.Clone(bad)
	want[4321] ^= 0x40
	if !bytes.Equal(quarantined(t, f, rep, "bad"), want) {
		t.Fatal("quarantined file is not the damaged file as it was")
	}
	if _, err := f.s.Stat("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat(bad) = %v", err)
	}
	if u := f.s.Usage(); u.Bytes != int64(len(good)) || u.Segments != 1 {
		t.Fatalf("usage %+v", u)
	}
	// The same id can be received again, and the quarantine is left alone
	// by later starts.
	put(t, f.s, "bad", bad)
	rep = reopen(t, f, "edged.db", opt)
	if len(rep.Quarantined)+len(rep.DroppedEntries)+len(rep.RemovedOrphans) != 0 {
		t.Fatalf("clean restart repaired %+v", rep)
	}
	if qs, _ := os.ReadDir(filepath.Join(f.dir, QuarantineDir)); len(qs) != 1 {
		t.Fatalf("quarantine holds %d files", len(qs))
	}
}

// TestQuarantineNamesDoNotCollide: the same id quarantined twice in one
// second keeps both files.
func TestQuarantineNamesDoNotCollide(t *testing.T) {
	opt := testOpts
	opt.Now = func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }
	f := newStore(t, "", opt)
	for i := range 2 {
		put(t, f.s, "x", content(100, byte(i)))
		must(t, os.Truncate(filepath.Join(f.dir, "segments", "x"), 10))
		reopen(t, f, "edged.db", opt)
	}
	qs, err := os.ReadDir(filepath.Join(f.dir, QuarantineDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range qs {
		names = append(names, q.Name())
	}
	if !slices.Equal(names, []string{"x.20261130T120000Z", "x.20261130T120000Z-1"}) {
		t.Fatalf("quarantine %v", names)
	}
}
