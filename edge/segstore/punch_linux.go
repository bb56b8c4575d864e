package segstore

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// punchHole zeroes n bytes of f at off and gives their whole blocks back
// to the file system, keeping f's size (evicted pack records, packs.go).
func punchHole(f *os.File, off, n int64) error {
	if n <= 0 {
		return nil
	}
	for {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != unix.EINTR {
			return err
		}
	}
}

// seekData returns the offset of the first byte of data at or after off
// in f, skipping holes (a punched pack's evicted records): off itself
// when that cannot be told, and -1 when there is no data after off.
func seekData(f *os.File, off int64) int64 {
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	switch {
	case err == unix.ENXIO:
		return -1
	case err != nil:
		return off
	}
	return d
}

// allocated is the disk space a file's blocks take (a punched pack's
// holes do not count).
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
