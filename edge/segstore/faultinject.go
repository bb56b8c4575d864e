//go:build faultinject

package segstore

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
)

// Fault injection for end-to-end tests of real edged processes
// (edge/e2e): a binary built with `go build -tags faultinject` lets a test
// make its segment store's writes fail with ENOSPC on demand, and stop
// failing on demand, instead of filling a real disk. Without the tag this
// file is not compiled and injectFaults (faultinject_off.go) does nothing:
// production builds have no hook, no environment lookup, no file reads.
//
// The test names a control file in the environment variable
// RELAY_SEGSTORE_FAULTS before starting edged. Open reads that variable
// once; after that every write step re-reads the file (there is no signal
// to send and no state to reset: rewrite or remove the file). The file
// holds whitespace-separated fault points; each listed point fails every
// write that reaches it with an ENOSPC *os.PathError whose operation reads
// "injected fault at <point>", so a test can tell from the receiver's
// NACK message or log which point fired. A missing or empty file injects
// nothing. The points, in the order a write passes them (see the package
// documentation for the commit sequence):
//
//	created  temp file created, nothing written yet
//	write    each write of content: half of the buffer reaches the temp
//	         file (or, for a packed segment, the pack), then ENOSPC (a
//	         partial temp file, or record, is left to clean up)
//	copied   content written and verified, not yet fsynced
//	synced   temp file fsynced, or ready for its group's syncfs (as if
//	         its fsync reported ENOSPC)
//	syncfs   the commit group's syncfs, before the renames (as if it
//	         reported ENOSPC: every segment of the group fails); only
//	         where the store uses syncfs (Linux 5.8 and later, without
//	         storage.fsync_each_file)
//	renamed  renamed into place, directory not yet fsynced (as if the
//	         directory fsync failed)
//	dirsync  directory fsynced, index entry not yet committed (as if the
//	         index commit failed)
//	packed   a packed segment's record appended to its pack, not yet
//	         durable (as if the pack's fsync failed: every packed segment
//	         of the group fails)
//
// One more point is not a write's and does not fail anything:
//
//	kill-unindex  the process kills itself (SIGKILL, as kill -9) right
//	              after an eviction's index transaction commits (for a
//	              takedown: the tombstone and receipt), before the file
//	              or pack record is removed
//
// A packed segment (storage.pack_max_bytes) passes write, copied, packed,
// syncfs and dirsync; created, synced and renamed are a segment file's.
// A small segment a peer sends is staged in memory (Reservation.Stage,
// edge/daemon's receive pipeline) and copied there before any point, so
// when it goes to a pack it passes only write, packed, syncfs and dirsync:
// a test that wants a refusal at copied (or at a file's points) must send
// a segment larger than the pack limit.
// Other words match nothing. Evictions and start-up repair are not
// affected: removing files does not run out of space.
//
// A unit test's own Store.fault or Options.WrapTemp takes precedence:
// injectFaults leaves them alone.
const faultsEnv = "RELAY_SEGSTORE_FAULTS"

// injectFaults installs the control file's faults on a newly opened
// Store.
func (s *Store) injectFaults() {
	ctl := os.Getenv(faultsEnv)
	if ctl == "" {
		return
	}
	if s.fault == nil {
		s.fault = func(st step) error {
			if st == stepUnindex && faultOn(ctl, "kill-unindex") {
				// kill -9 of this process right after an eviction's index
				// commit (a takedown's: tombstone and receipt committed),
				// before its file or pack record is removed.
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
			switch st {
			case stepCreated, stepCopied, stepSynced, stepRenamed, stepDirSync, stepPacked:
			default:
				return nil
			}
			if !faultOn(ctl, string(st)) {
				return nil
			}
			return injected(string(st), s.dir)
		}
	}
	if sync := s.fsSync; sync != nil {
		s.fsSync = func() error {
			if faultOn(ctl, "syncfs") {
				return injected("syncfs", s.dir)
			}
			return sync()
		}
	}
	if s.opt.WrapTemp == nil {
		s.opt.WrapTemp = func(id string, w io.Writer) io.Writer { return &faultWriter{w: w, ctl: ctl, id: id} }
	}
}

// faultOn reports whether the control file lists point.
func faultOn(ctl, point string) bool {
	b, err := os.ReadFile(ctl)
	if err != nil {
		return false
	}
	return slices.Contains(strings.Fields(string(b)), point)
}

func injected(point, path string) error {
	return &os.PathError{Op: fmt.Sprintf("injected fault at %s", point), Path: path, Err: syscall.ENOSPC}
}

// faultWriter is the temp file's writer under the fault point "write".
type faultWriter struct {
	w       io.Writer
	ctl, id string
}

func (f *faultWriter) Write(p []byte) (int, error) {
	if !faultOn(f.ctl, "write") {
		return f.w.Write(p)
	}
	n, err := f.w.Write(p[:len(p)/2])
	if err != nil {
		return n, err
	}
	return n, injected("write", f.id)
}
