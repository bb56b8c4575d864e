package bolt_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/relaycore"
)

func putKV(t *testing.T, st relaycore.Store, p relaycore.Partition, k, v string) {
	t.Helper()
	if err := st.Apply(t.Context(), p, relaycore.Batch{Writes: []relaycore.Write{{Key: k, Value: []byte(v)}}}); err != nil {
		t.Fatal(err)
	}
}

func getKV(t *testing.T, st relaycore.Store, p relaycore.Partition, k string) string {
	t.Helper()
	v, ok, err := st.Get(t.Context(), p, k)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return "<absent>"
	}
	return string(v)
}

// writeSnapshot writes s to a new file and opens it.
func writeSnapshot(t *testing.T, s *bolt.Snapshot) *bolt.DB {
	t.Helper()
	var buf bytes.Buffer
	n, err := s.WriteTo(&buf)
	if err != nil || n != s.Size() || int64(buf.Len()) != n {
		t.Fatalf("write snapshot: %d bytes of %d (%v)", n, s.Size(), err)
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Check(); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestSnapshotIsThePast: a snapshot holds the file as of when it was
// taken, while writes go on in the live file; Snapshots of two files see
// both at the same instant.
func TestSnapshotIsThePast(t *testing.T) {
	dir := t.TempDir()
	a, err := bolt.Open(filepath.Join(dir, "a.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := bolt.Open(filepath.Join(dir, "b.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	putKV(t, a.Store("t"), "p", "k", "before")
	putKV(t, b.Store("t"), "p", "k", "before")

	snaps, err := bolt.Snapshots(a, b)
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, a.Store("t"), "p", "k", "after") // the live files move on
	putKV(t, b.Store("t"), "p", "k", "after")
	for i, s := range snaps {
		copyDB := writeSnapshot(t, s)
		if got := getKV(t, copyDB.Store("t"), "p", "k"); got != "before" {
			t.Errorf("snapshot %d: k = %q, want before", i, got)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := getKV(t, writeSnapshot(t, s).Store("t"), "p", "k"); got != "after" {
		t.Errorf("second snapshot: k = %q, want after", got)
	}
}

// TestCopyFile: a closed file is copied whole; a file another handle
// holds open for writing is refused with ErrLocked (bbolt's lock is per
// open file description, so a second Open in this process stands in for
// another process); a missing file is an error, not a new empty file.
func TestCopyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	db, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, db.Store("t"), "p", "k", "v")
	if _, err := bolt.CopyFile(path, &bytes.Buffer{}, 50*time.Millisecond); !errors.Is(err, bolt.ErrLocked) {
		t.Fatalf("copy of an open file: %v, want ErrLocked", err)
	}
	db.Close()

	var buf bytes.Buffer
	n, err := bolt.CopyFile(path, &buf, 0)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("copy: %d (%v)", n, err)
	}
	out := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(out, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := bolt.Open(out, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := getKV(t, c.Store("t"), "p", "k"); got != "v" {
		t.Fatalf("copy: k = %q", got)
	}
	missing := filepath.Join(t.TempDir(), "none.db")
	if _, err := bolt.CopyFile(missing, &buf, 0); err == nil {
		t.Fatal("copy of a missing file succeeded")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("copy created %s", missing)
	}
}
