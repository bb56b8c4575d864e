package segstore

import "syscall"

// setTag and getTag keep a segment's digest tag in an extended attribute
// of its file (see tag.go). They fail on file systems without user
// extended attributes (vfat, some tmpfs), which the callers tolerate.
func setTag(path string, v []byte) error { return syscall.Setxattr(path, tagAttr, v, 0) }

func getTag(path string) ([]byte, error) {
	buf := make([]byte, maxTagLen)
	n, err := syscall.Getxattr(path, tagAttr, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
