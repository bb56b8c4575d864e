package segstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing n bytes of f at off to
// disk, without waiting (sync_file_range(2) with SYNC_FILE_RANGE_WRITE
// only). Errors are ignored: it is a hint, and a failed writeback shows in
// the commit's fsync or syncfs.
func startWriteback(f *os.File, off, n int64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
