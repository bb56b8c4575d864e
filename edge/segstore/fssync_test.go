package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// storeMode is a named set of Options that the crash and fault tests run
// under.
type storeMode struct {
	name string
	opts Options
}

// syncModes are the two ways a group is made durable: one syncfs of the
// file system (the default where the kernel reports its errors) and an
// fsync of every file (FsyncEachFile, and every other system). The
// crash and fault tests run both.
var syncModes = []storeMode{
	{"syncfs", testOpts},
	{"fsync_each", func() Options { o := testOpts; o.FsyncEachFile = true; return o }()},
}

// TestSyncfsFailureFailsGroup: when the group's syncfs reports an error
// (a writeback error anywhere on the file system since the last one),
// no segment of the group is acknowledged or left behind, and the next
// group commits normally. The failure is injected around the real
// syncfs.
func TestSyncfsFailureFailsGroup(t *testing.T) {
	f := newStore(t, "", testOpts)
	if f.s.fsSync == nil {
		t.Skip("no syncfs on this system")
	}
	real := f.s.fsSync
	var mu sync.Mutex
	calls := 0
	f.s.fsSync = func() error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 2 { // the group after the lead's
			return fmt.Errorf("injected: %w", syscall.EIO)
		}
		return real()
	}
	errs, _ := groupOf(t, f, 6, nil)
	for i, err := range errs {
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("g%d: %v, want the syncfs error", i, err)
		}
		if _, err := f.s.Stat(fmt.Sprintf("g%d", i)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("g%d indexed after a failed syncfs: %v", i, err)
		}
		if _, err := os.Stat(filepath.Join(f.dir, "segments", fmt.Sprintf("g%d", i))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("g%d file left after a failed syncfs: %v", i, err)
		}
	}
	b := content(300, 4)
	put(t, f.s, "after", b)
	if !bytes.Equal(read(t, f.s, "after"), b) {
		t.Fatal("write after a failed group")
	}
}
