package segstore

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// fsSyncer returns a function that flushes the whole file system holding
// dir with syncfs(2), or nil when that is not safe to rely on: Linux
// before 5.8 (syncfs did not report writeback errors there, so a failed
// write could go unnoticed and be acknowledged), or dir cannot be opened.
//
// The directory stays open for the Store's life: since 5.8 syncfs reports
// every writeback error of the file system that happened since the
// previous syncfs on the same open file, and a file opened per call would
// miss the errors from before its opening (an early writeback of a temp
// file that failed). An error may also come from another program's file
// on the same file system: the group then fails and its senders retry,
// which costs a retry, never a segment.
func fsSyncer(dir string) func() error {
	if !syncfsReportsErrors() {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	return func() error {
		for {
			err := unix.Syncfs(int(d.Fd()))
			if err != unix.EINTR {
				return err
			}
		}
	}
}

// syncfsReportsErrors reports whether the running kernel is 5.8 or later.
func syncfsReportsErrors() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 8)
}

// kernelAtLeast parses the major and minor numbers of a Linux release
// string ("6.1.0-18-amd64") and compares them; an unparsable release is
// taken for an old one.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err := strconv.Atoi(parts[0])
	if err != nil {
		return false
	}
	end := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if end == -1 {
		end = len(parts[1])
	}
	min, err := strconv.Atoi(parts[1][:end])
	if err != nil {
		return false
	}
	return maj > major || maj == major && min >= minor
}
