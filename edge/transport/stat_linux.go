package transport

import (
	"os"
	"syscall"
	"time"
)

// inodeAndCtime lets the Reloader notice a file replaced by rename (new
// inode) or rewritten in place within one mtime tick (ctime also moves on
// chmod/chown, which only causes a harmless re-read).
func inodeAndCtime(fi os.FileInfo) (int64, time.Time) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, time.Time{}
	}
	return int64(st.Ino), time.Unix(int64(st.Ctim.Sec), int64(st.Ctim.Nsec))
}
