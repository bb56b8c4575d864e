package segstore

import "os"

// writeBehindWindow is how often a large segment's receive asks the kernel
// to start writing back what it has written so far. On this project's
// test machine, a 64 MiB receive's final fsync took 26-30 ms with the
// whole file dirty, and 5-6 ms when writeback had been started every
// 8 MiB while it was written (docs/benchmarks.md).
const writeBehindWindow = 8 << 20

// writeBehind passes writes through to a temp file and, every window
// bytes, starts the writeback of the window just written (startWriteback:
// sync_file_range(SYNC_FILE_RANGE_WRITE) on Linux, nothing elsewhere). It
// is a hint that moves disk work from the commit's fsync to the copy; it
// waits for nothing and makes nothing durable, and a writeback error it
// causes is reported by that fsync (or syncfs) as any other, so the
// durability contract is the commit's as before. Segments smaller than a
// window never issue one.
type writeBehind struct {
	f       *os.File
	window  int64 // 0: off
	written int64
	started int64 // bytes whose writeback was started
	hints   int   // calls of startWriteback, for tests
}

func (w *writeBehind) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.written += int64(n)
	for w.window > 0 && w.written-w.started >= w.window {
		startWriteback(w.f, w.started, w.window)
		w.started += w.window
		w.hints++
	}
	return n, err
}
