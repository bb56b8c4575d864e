//go:build faultinject

package segstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestInjectedFaults: in a faultinject build, each fault point named in
// the control file fails a write with ENOSPC (ErrQuota, naming the
// point), leaves nothing behind (newStore checks the invariant at the
// end), and emptying the file lets the same write succeed. Run by make
// test with -tags faultinject.
func TestInjectedFaults(t *testing.T) {
	ctl := filepath.Join(t.TempDir(), "faults")
	t.Setenv(faultsEnv, ctl)
	b := content(100_000, 5) // several writes of the copy loop
	for _, point := range []string{"created", "write", "copied", "synced", "syncfs", "renamed", "dirsync"} {
		t.Run(point, func(t *testing.T) {
			f := newStore(t, "", testOpts)
			if point == "syncfs" && f.s.fsSync == nil {
				t.Skip("this store fsyncs each file: no syncfs to fail")
			}
			if err := os.WriteFile(ctl, []byte("unknown "+point+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := f.s.Write("s", int64(len(b)), digest(b), bytes.NewReader(b), "")
			if !errors.Is(err, ErrQuota) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "injected fault at "+point) {
				t.Fatalf("Write = %v", err)
			}
			checkInvariant(t, f)
			if err := os.WriteFile(ctl, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			put(t, f.s, "s", b)
		})
	}
	t.Run("no control file", func(t *testing.T) {
		t.Setenv(faultsEnv, filepath.Join(t.TempDir(), "absent"))
		f := newStore(t, "", testOpts)
		put(t, f.s, "s", b)
	})
}
