package bolt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
	berrors "go.etcd.io/bbolt/errors"
)

// batchOf returns n puts of size bytes each, keys prefixed by prefix.
func batchOf(prefix string, n, size int) relaycore.Batch {
	var b relaycore.Batch
	v := make([]byte, size)
	for i := range n {
		b.Writes = append(b.Writes, relaycore.Write{Key: fmt.Sprintf("%s/%04d", prefix, i), Value: v})
	}
	return b
}

// TestFullFileIsSurelyNotApplied fills a file capped by MaxSize. bbolt
// fails the commit while growing the file, before any page is written, so
// the store must report the batch as surely not applied, leave no trace of
// it, and keep serving reads and writes that fit.
func TestFullFileIsSurelyNotApplied(t *testing.T) {
	db := openTemp(t, Options{MaxSize: 1 << 20})
	s := db.Store("relay")
	var (
		err     error
		applied int
	)
	for ; applied < 100; applied++ {
		err = s.Apply(t.Context(), "p", batchOf(fmt.Sprint(applied), 50, 1000))
		if err != nil {
			break
		}
	}
	if !errors.Is(err, berrors.ErrMaxSizeReached) {
		t.Fatalf("after %d batches: apply = %v, want ErrMaxSizeReached", applied, err)
	}
	if relaycore.MayBeApplied(err) {
		t.Fatalf("full file reported maybe-applied: %v", err)
	}
	if cerr := db.CommitErr(); !errors.Is(cerr, berrors.ErrMaxSizeReached) {
		t.Fatalf("CommitErr after the refused commit = %v, want ErrMaxSizeReached", cerr)
	}
	// A batch refused before its commit says nothing about the file.
	stale := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "0/0000", Absent: true}}, Writes: []relaycore.Write{{Key: "x", Value: []byte("x")}}}
	if _, ok := relaycore.FailedPrecondition(s.Apply(t.Context(), "p", stale)); !ok || db.CommitErr() == nil {
		t.Fatalf("a false precondition cleared CommitErr (%v)", db.CommitErr())
	}
	page, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{Start: fmt.Sprint(applied), End: fmt.Sprint(applied) + "0"})
	if err != nil || len(page.Items) != 0 {
		t.Fatalf("refused batch left %d items (%v)", len(page.Items), err)
	}
	all, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{Limit: 100000})
	if err != nil || len(all.Items) != applied*50 {
		t.Fatalf("after the refusal: %d items (%v), want %d", len(all.Items), err, applied*50)
	}
	// Deleting frees pages, so the store is usable again.
	var dels relaycore.Batch
	for i := range 50 {
		dels.Writes = append(dels.Writes, relaycore.Write{Key: fmt.Sprintf("0/%04d", i), Delete: true})
	}
	if err := s.Apply(t.Context(), "p", dels); err != nil {
		t.Fatalf("delete after the refusal: %v", err)
	}
	if err := s.Apply(t.Context(), "p", batchOf("again", 5, 100)); err != nil {
		t.Fatalf("small write after freeing space: %v", err)
	}
	if cerr := db.CommitErr(); cerr != nil {
		t.Fatalf("CommitErr after commits succeeded again = %v", cerr)
	}
}

// TestCommitIOErrorMayBeApplied makes bbolt's own file I/O fail by
// closing the file descriptor under it (the memory map stays readable).
// Commit then returns a raw I/O error, which the store must report as
// maybe-applied: it cannot tell a failure before the meta page (nothing
// committed) from one while writing or syncing it. Two paths are covered:
// a commit that must grow the file (it fails stating the file) and one
// that fits in freed pages (it fails writing them). The file reopened
// afterwards is consistent and holds either the whole batch or none of it.
func TestCommitIOErrorMayBeApplied(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(t *testing.T, s *Store)
		wantErr string
	}{
		{"grow", func(*testing.T, *Store) {}, "stat"},
		{"write", func(t *testing.T, s *Store) {
			// Free more pages than the failing batch needs, and commit
			// twice more so bbolt may reuse them.
			if err := s.Apply(t.Context(), "tmp", batchOf("tmp", 50, 1000)); err != nil {
				t.Fatal(err)
			}
			dels := batchOf("tmp", 50, 0)
			for i := range dels.Writes {
				dels.Writes[i].Delete = true
			}
			for _, b := range []relaycore.Batch{dels, batchOf("x", 1, 1), batchOf("y", 1, 1)} {
				if err := s.Apply(t.Context(), "tmp", b); err != nil {
					t.Fatal(err)
				}
			}
		}, "write"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "relay.db")
			var file *os.File
			db, err := Open(path, Options{openFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := os.OpenFile(name, flag, perm)
				file = f
				return f, err
			}})
			if err != nil {
				t.Fatal(err)
			}
			s := db.Store("relay")
			if err := s.Apply(t.Context(), "p", batchOf("before", 10, 10)); err != nil {
				t.Fatal(err)
			}
			c.prepare(t, s)
			if err := file.Close(); err != nil {
				t.Fatal(err)
			}
			err = s.Apply(t.Context(), "p", batchOf("during", 10, 10))
			if err == nil {
				t.Fatal("apply succeeded with the file closed")
			}
			t.Logf("apply with the descriptor closed: %v", err)
			if !relaycore.MayBeApplied(err) {
				t.Fatalf("commit I/O error %v not reported as maybe-applied", err)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("commit failed with %q, not in the %s path this case is for", err, c.wantErr)
			}
			if cerr := db.CommitErr(); cerr == nil || !strings.Contains(err.Error(), cerr.Error()) {
				t.Fatalf("CommitErr = %v after the commit failed with %v", cerr, err)
			}
			_ = db.Close() // fails too: the descriptor is gone

			db = openPath(t, path, Options{})
			page, err := db.Store("relay").Scan(t.Context(), "p", relaycore.ScanRequest{})
			if err != nil {
				t.Fatal(err)
			}
			during := 0
			for _, it := range page.Items {
				if strings.HasPrefix(it.Key, "during") {
					during++
				}
			}
			if len(page.Items)-during != 10 || (during != 0 && during != 10) {
				t.Fatalf("after reopening: %d items, %d of the failed batch; want 10 before and all or none of the batch", len(page.Items), during)
			}
		})
	}
}
