package segstore

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// dirSyncs records SyncDir calls and performs them.
type dirSyncs struct{ dirs []string }

func (r *dirSyncs) sync(dir string) error {
	r.dirs = append(r.dirs, dir)
	return SyncDir(dir)
}

// TestOpenSyncsCreatedDirs: Open creates <dir>/segments and <dir>/packs
// (and dir itself
// if missing) and fsyncs the parent of each directory it created, oldest
// first, so a crash right after start-up cannot lose their entries. An
// existing layout is not synced again.
func TestOpenSyncsCreatedDirs(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "state", "edged")
	db, err := bolt.Open(filepath.Join(base, "edged.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rec := &dirSyncs{}
	opt := Options{QuotaBytes: 1 << 20, QuotaSegments: 10, MaxSegmentBytes: 1 << 10, SyncDir: rec.sync}
	if _, err := Open(dir, db, opt); err != nil {
		t.Fatal(err)
	}
	want := []string{base, filepath.Join(base, "state"), dir, dir} // dir: for segments/, then packs/
	if !slices.Equal(rec.dirs, want) {
		t.Fatalf("synced %v, want %v (the parent of each created directory)", rec.dirs, want)
	}
	rec.dirs = nil
	if _, err := Open(dir, db, opt); err != nil {
		t.Fatal(err)
	}
	if len(rec.dirs) != 0 {
		t.Fatalf("reopening synced %v; nothing was created", rec.dirs)
	}
}

// TestCreateDirSyncFailure: a failed fsync of a new directory's parent is
// an error, not a silently non-durable directory.
func TestCreateDirSyncFailure(t *testing.T) {
	boom := errors.New("fsync failed")
	err := CreateDir(filepath.Join(t.TempDir(), "x"), 0o700, func(string) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("CreateDir = %v, want the fsync error", err)
	}
	if err := CreateDir(filepath.Join(t.TempDir(), "f", "g"), 0o700, nil); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CreateDir(filepath.Join(file, "sub"), 0o700, nil); err == nil {
		t.Fatal("CreateDir under a regular file succeeded")
	}
}
