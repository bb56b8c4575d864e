//go:build !linux

package segstore

import "os"

// punchHole is not available here: Open's probe then keeps every segment
// in a file of its own (packs.go).
func punchHole(*os.File, int64, int64) error { return errPackUnsupported }

// seekData cannot skip holes here: the caller reads on from off.
func seekData(_ *os.File, off int64) int64 { return off }

// allocated is a file's size here: packs are off on these platforms.
func allocated(fi os.FileInfo) int64 { return fi.Size() }
