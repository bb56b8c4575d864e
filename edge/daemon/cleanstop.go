package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/segstore"
)

// CleanStopFile, in storage.dir, says the previous run stopped cleanly:
// Close writes it after the database is closed, and New removes it (durably)
// before opening anything. So it is present at a start exactly when the
// previous run ended in Close, and absent after a crash, kill -9 or power
// loss, which is when storage.verify_on_start: unclean_stop hashes every
// stored segment. Its directory fsyncs use segstore.SyncDir, not
// Options.SyncDir, which is about creating the layout.
const CleanStopFile = "clean-stop"

// takeCleanStop reports whether the marker was there and removes it. A
// failure to remove it is an error: a marker left behind would vouch for
// a run that may yet crash.
func takeCleanStop(dir string) (bool, error) {
	path := filepath.Join(dir, CleanStopFile)
	err := os.Remove(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	if err := segstore.SyncDir(dir); err != nil {
		return false, fmt.Errorf("remove %s: fsync %s: %w", path, dir, err)
	}
	return true, nil
}

// markCleanStop writes the marker (fsynced, with its directory entry).
func markCleanStop(dir string) error {
	path := filepath.Join(dir, CleanStopFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = segstore.SyncDir(dir)
	}
	return err
}

// How the previous run ended (rpc.Storage.PreviousStop).
const (
	stopClean   = "clean"
	stopUnclean = "unclean"
	stopNone    = "none" // a new store: no database before this start
)

// previousStop says how the previous run ended, as far as this start can
// tell: a clean-stop marker, no marker, or no previous run at all (no
// database yet; a store whose database was deleted by hand counts too,
// since nothing says how its last run ended).
func (d *Daemon) previousStop() string {
	switch {
	case d.cleanStop:
		return stopClean
	case d.newStore:
		return stopNone
	}
	return stopUnclean
}

// verifyOnOpen decides whether this start hashes every stored segment.
func verifyOnOpen(mode string, cleanStop bool) bool {
	return mode == config.VerifyAlways || (mode == config.VerifyUncleanStop && !cleanStop)
}
