package segstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var writeSteps = []step{stepCreated, stepCopied, stepSynced, stepRenamed, stepDirSync, stepIndexed}

// TestWriteFaultAtEachStep fails the commit path at each step with an
// error (as a failing fsync, rename or disk would), for a segment file and
// for a packed record, and checks that nothing of the attempt remains (no
// file, the pack cut back), the quota and the staging budget are whole,
// and the same segment can then be written. At stepIndexed the entry is
// already committed, so the write must succeed. Each runs for a segment
// received (Receive) and for one staged in memory (Stage), whose Commit
// writes the file.
func TestWriteFaultAtEachStep(t *testing.T) {
	b := content(50_000, 7)
	layouts := []struct {
		modes []storeMode
		open  func(*testing.T, string, Options) *fixture
		steps []step
	}{
		{syncModes, newStore, writeSteps},
		{packModes, newPackStore, []step{stepCopied, stepPacked, stepDirSync, stepIndexed}},
	}
	for _, l := range layouts {
		for _, mode := range l.modes {
			for _, at := range l.steps {
				for _, via := range []string{"receive", "stage"} {
					if via == "stage" && at == stepCopied && mode.opts.PackMaxBytes > 0 {
						continue // a staged record is copied by Stage, before any step
					}
					t.Run(mode.name+"/"+via+"/"+string(at), func(t *testing.T) {
						f := l.open(t, "", mode.opts)
						put(t, f.s, "other", content(10, 1))
						injected := errors.New("injected fault at " + string(at))
						f.s.fault = func(st step) error {
							if st == at {
								return injected
							}
							return nil
						}
						var err error
						if via == "stage" {
							err = stageAndCommit(f.s, "s", b)
						} else {
							_, err = f.s.Write("s", int64(len(b)), digest(b), bytes.NewReader(b), "")
						}
						if at == stepIndexed {
							if err != nil {
								t.Fatalf("committed write reported %v", err)
							}
							return
						}
						if !errors.Is(err, injected) {
							t.Fatalf("err = %v", err)
						}
						if _, err := f.s.Stat("s"); !errors.Is(err, ErrNotFound) {
							t.Fatalf("index entry after failed write: %v", err)
						}
						if _, err := os.Stat(filepath.Join(f.dir, "segments", "s")); !errors.Is(err, os.ErrNotExist) {
							t.Fatalf("segment file after failed write: %v", err)
						}
						checkInvariant(t, f)
						if u := f.s.Usage(); u.Bytes != 10 || u.Segments != 1 || u.ReservedBytes != 0 || f.s.mem.inUse() != 0 {
							t.Fatalf("usage %+v, receive memory in use %d", u, f.s.mem.inUse())
						}
						f.s.fault = nil
						put(t, f.s, "s", b)
					})
				}
			}
		}
	}
}

// stageAndCommit writes a segment the way a pipelined receiver does with a
// small one: Reserve, Stage, Commit.
func stageAndCommit(s *Store, id string, b []byte) error {
	r, err := s.Reserve(id, int64(len(b)), digest(b))
	if err != nil {
		return err
	}
	defer r.Release()
	st, err := r.Stage(context.Background(), "peer")
	if err != nil {
		return err
	}
	if err := st.Fill(bytes.NewReader(b)); err != nil {
		return err
	}
	_, err = st.Commit()
	return err
}

// TestCrashAtEachStep simulates kill -9 at each step of the commit path
// and of eviction, for a segment file and for a packed record: the fault
// hook copies the store's files and the database (a consistent bbolt
// snapshot) as they are at that instant; a new Store opened on the copy
// must satisfy the invariant (a pack is cut back and its dead space
// punched), and hold the segment exactly when its index entry had been
// committed.
func TestCrashAtEachStep(t *testing.T) {
	type tc struct {
		at       step
		evicting bool
		present  bool // after recovery
		repaired func(ScanReport) []string
	}
	layouts := []struct {
		size  int
		modes []storeMode
		open  func(*testing.T, string, Options) *fixture
		cases []tc
	}{
		{70_000, syncModes, newStore, []tc{
			{stepCreated, false, false, func(r ScanReport) []string { return r.RemovedTemp }},
			{stepCopied, false, false, func(r ScanReport) []string { return r.RemovedTemp }},
			{stepSynced, false, false, func(r ScanReport) []string { return r.RemovedTemp }},
			{stepRenamed, false, false, func(r ScanReport) []string { return r.RemovedOrphans }},
			{stepDirSync, false, false, func(r ScanReport) []string { return r.RemovedOrphans }},
			{stepIndexed, false, true, nil},
			{stepUnindex, true, false, func(r ScanReport) []string { return r.RemovedOrphans }},
			{stepUnlinked, true, false, nil},
		}},
		{30_000, packModes, newPackStore, []tc{
			{stepCopied, false, false, nil},
			{stepPacked, false, false, nil},
			{stepDirSync, false, false, nil},
			{stepIndexed, false, true, nil},
			{stepUnindex, true, false, nil},
			{stepUnlinked, true, false, nil},
		}},
	}
	for _, l := range layouts {
		b := content(l.size, 3)
		for _, mode := range l.modes {
			for _, c := range l.cases {
				t.Run(mode.name+"/"+string(c.at), func(t *testing.T) {
					f := l.open(t, "", mode.opts)
					put(t, f.s, "keep", content(123, 5))
					if c.evicting {
						put(t, f.s, "s", b)
					}
					put(t, f.s, "keep2", content(321, 6))
					snap := t.TempDir()
					taken := false
					f.s.fault = func(st step) error {
						if st == c.at {
							snapshot(t, f, snap)
							taken = true
						}
						return nil
					}
					var err error
					if c.evicting {
						err = f.s.Evict("s")
					} else {
						_, err = f.s.Write("s", int64(len(b)), digest(b), bytes.NewReader(b), "")
					}
					if err != nil || !taken {
						t.Fatalf("operation: %v, snapshot taken: %v", err, taken)
					}

					g := l.open(t, snap, mode.opts)
					_, err = g.s.Stat("s")
					if c.present != (err == nil) {
						t.Fatalf("after crash at %s: Stat = %v, want present=%v", c.at, err, c.present)
					}
					if c.present && !bytes.Equal(read(t, g.s, "s"), b) {
						t.Fatal("recovered content differs")
					}
					if !bytes.Equal(read(t, g.s, "keep"), content(123, 5)) || !bytes.Equal(read(t, g.s, "keep2"), content(321, 6)) {
						t.Fatal("unrelated segment damaged")
					}
					rep := g.s.Recovered()
					if c.repaired != nil && len(c.repaired(rep)) != 1 {
						t.Fatalf("scan report %+v", rep)
					}
					if c.repaired == nil && len(rep.RemovedTemp)+len(rep.RemovedOrphans)+len(rep.DroppedEntries)+len(rep.Quarantined) != 0 {
						t.Fatalf("scan repaired something after a clean point: %+v", rep)
					}
					checkInvariant(t, g)
					// The recovered store keeps working: the interrupted write
					// can be repeated (or is already there).
					if _, err := g.s.Write("s", int64(len(b)), digest(b), bytes.NewReader(b), ""); err != nil && !errors.Is(err, ErrAlreadyHave) {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// snapshot copies segments/, packs/ (if there is one) and a consistent
// copy of the database into dst.
func snapshot(t *testing.T, f *fixture, dst string) {
	t.Helper()
	for _, sub := range []string{"segments", packDirName} {
		des, err := os.ReadDir(filepath.Join(f.dir, sub))
		if errors.Is(err, os.ErrNotExist) && sub == packDirName {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Join(dst, sub), 0o700))
		for _, de := range des {
			copyFile(t, filepath.Join(f.dir, sub, de.Name()), filepath.Join(dst, sub, de.Name()))
		}
	}
	if err := f.db.View(func(tx *bolt.Tx) error {
		return tx.CopyFile(filepath.Join(dst, "edged.db"), 0o600)
	}); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStartupReconcile plants every kind of debris and checks that Open
// repairs it, reports it, and leaves unknown files alone. A file of the
// wrong size (torn) is quarantined, not removed.
func TestStartupReconcile(t *testing.T) {
	dir := t.TempDir()
	f := newStore(t, dir, testOpts)
	put(t, f.s, "good", content(100, 1))
	put(t, f.s, "lost", content(100, 2))
	put(t, f.s, "short", content(100, 3))
	seg := filepath.Join(dir, "segments")
	must(t, os.Remove(filepath.Join(seg, "lost")))
	must(t, os.Truncate(filepath.Join(seg, "short"), 50))
	must(t, os.WriteFile(filepath.Join(seg, tmpPrefix+"x-123"), []byte("partial"), 0o600))
	must(t, os.WriteFile(filepath.Join(seg, "orphan"), []byte("no entry"), 0o600))
	must(t, os.WriteFile(filepath.Join(seg, ".operator-notes"), []byte("keep me"), 0o600))
	must(t, os.Mkdir(filepath.Join(seg, "subdir"), 0o700))
	must(t, f.db.Close())

	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.db, f.s = db, nil
	s, err := Open(dir, db, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	rep := s.Recovered()
	slices.Sort(rep.DroppedEntries)
	slices.Sort(rep.RemovedOrphans)
	slices.Sort(rep.Unknown)
	if !slices.Equal(rep.DroppedEntries, []string{"lost", "short"}) ||
		!slices.Equal(rep.RemovedOrphans, []string{"orphan"}) ||
		len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "short" ||
		!slices.Equal(rep.RemovedTemp, []string{tmpPrefix + "x-123"}) ||
		!slices.Equal(rep.Unknown, []string{".operator-notes", "subdir"}) {
		t.Fatalf("report %+v", rep)
	}
	if u := s.Usage(); u.Bytes != 100 || u.Segments != 1 {
		t.Fatalf("usage %+v", u)
	}
	if _, err := os.Stat(filepath.Join(seg, ".operator-notes")); err != nil {
		t.Fatalf("unknown file touched: %v", err)
	}
	// newStore's cleanup checks the invariant on the reopened store.
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
