package bolt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
}

// TestCommitIOErrorMayBeApplied makes bbolt's own page writes fail by
// closing the file descriptor under it (the memory map stays readable).
// Commit then returns a raw I/O error, which the store must report as
// maybe-applied: it cannot tell a failed data-page write from a failed
// meta-page write. The file reopened afterwards is consistent and holds
// either the whole batch or none of it.
func TestCommitIOErrorMayBeApplied(t *testing.T) {
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
	if err := file.Close(); err != nil {
		t.Fatal(err)
	}
	err = s.Apply(t.Context(), "p", batchOf("during", 10, 10))
	if err == nil {
		t.Fatal("apply succeeded with the file closed")
	}
	if !relaycore.MayBeApplied(err) {
		t.Fatalf("commit I/O error %v not reported as maybe-applied", err)
	}
	t.Logf("apply with the descriptor closed: %v", err)
	_ = db.Close() // fails too: the descriptor is gone

	db = openPath(t, path, Options{})
	page, err := db.Store("relay").Scan(t.Context(), "p", relaycore.ScanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	during := 0
	for _, it := range page.Items {
		if it.Key[:6] == "during" {
			during++
		}
	}
	if len(page.Items)-during != 10 || (during != 0 && during != 10) {
		t.Fatalf("after reopening: %d items, %d of the failed batch; want 10 before and all or none of the batch", len(page.Items), during)
	}
	t.Logf("the failed batch is %s after reopening", map[bool]string{true: "present", false: "absent"}[during == 10])
}
