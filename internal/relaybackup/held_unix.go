//go:build unix

package relaybackup

import (
	"errors"
	"os"
	"syscall"
)

// heldOpen reports whether a process holds path's bbolt lock (bbolt
// flocks its file for as long as it has it open, exclusively for a writer,
// shared for a reader). A file that does not exist is not held.
func heldOpen(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
