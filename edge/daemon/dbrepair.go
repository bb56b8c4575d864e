package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// dbRepair says what openDB did about a damaged database.
type dbRepair struct {
	MovedAside string // where the damaged file went; "" if it was fine
	Damage     string // why it was set aside
}

// errNotDamage marks an open failure that says nothing about the file's
// content (another process holds it, edged may not read it): setting the
// file aside would lose a good ledger over a deployment mistake.
var errNotDamage = errors.New("database not opened")

// openDB opens path, checks it (checkDB) and, when bbolt cannot open it or
// the check fails, moves it aside to path.damaged-<UTC time> (never
// deleting it) and creates a new database in its place. The segment
// store then rebuilds its index from the segment files and reconciliation
// re-derives the ledger (docs/edge.md, "Self-repair at start"), so bad
// state costs a re-offer of what is stored instead of a crash loop.
func openDB(path string, now time.Time, syncDir func(string) error) (*bolt.DB, dbRepair, error) {
	_, statErr := os.Stat(path)
	db, err := openChecked(path)
	if err == nil || errors.Is(err, errNotDamage) {
		if err == nil && errors.Is(statErr, os.ErrNotExist) {
			// bbolt fsyncs the file it creates, not the directory entry
			// naming it: without this a crash could leave a store whose
			// index and ledger vanished while its segment files remained.
			if serr := syncDir(filepath.Dir(path)); serr != nil {
				db.Close()
				return nil, dbRepair{}, fmt.Errorf("open %s: fsync %s: %w", path, filepath.Dir(path), serr)
			}
		}
		return db, dbRepair{}, err
	}
	rep := dbRepair{Damage: err.Error()}
	rep.MovedAside, err = moveAside(path, now)
	if err != nil {
		return nil, rep, fmt.Errorf("open %s: damaged (%s), and setting it aside failed: %w", path, rep.Damage, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return nil, rep, fmt.Errorf("open %s: fsync %s: %w", path, filepath.Dir(path), err)
	}
	db, err = openChecked(path)
	if err != nil {
		return nil, rep, fmt.Errorf("open %s after setting the damaged one aside: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		db.Close()
		return nil, rep, fmt.Errorf("open %s: fsync %s: %w", path, filepath.Dir(path), err)
	}
	return db, rep, nil
}

// openChecked is bolt.Open followed by checkDB. A failure that is not
// about the file's content wraps errNotDamage.
func openChecked(path string) (db *bolt.DB, err error) {
	// bbolt reads the file through a memory map: a page past the end of a
	// truncated file faults (SIGBUS) and would kill the process. With
	// SetPanicOnFault, which applies to this goroutine only, the fault is
	// a panic that recoverDamage turns into damage. A panic inside
	// bolt.Open leaks its file descriptor and lock; the file is then moved
	// aside and a new one (another inode) opened, so neither is in the way.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverDamage(&err)
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("%w: %s is locked by another process (is another edged using this storage.dir?)", errNotDamage, path)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, os.ErrNotExist):
		// ErrNotExist: storage.dir itself went away under us.
		return nil, fmt.Errorf("%w: %w", errNotDamage, err)
	case err != nil:
		return nil, fmt.Errorf("bbolt cannot open it: %w", err)
	}
	if err := checkDB(db, path); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// recoverDamage turns a panic while reading the database (bbolt panics on
// pages it cannot make sense of; with SetPanicOnFault, a read of the
// memory map past a truncated file's end panics too instead of killing the
// process) into an error that reports damage.
func recoverDamage(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("reading it failed: %v", r)
	}
}

// checkDB reads the whole database before anything relies on it: the
// file must be as long as the pages it claims, every bucket and value must
// be readable, every index entry and ledger record must decode, and
// bbolt's own consistency check (page reachability, freelist) must pass.
// bbolt keeps checksums only on its meta pages, so damage elsewhere shows
// up only when a page is read; reading everything at start moves that
// moment to where it can be repaired. It runs in openChecked's goroutine,
// with faults turned into panics and recovered, and bbolt's
// Check, which reads in a goroutine of its own, only after the walk has
// touched every reachable page safely.
func checkDB(db *bolt.DB, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %w", errNotDamage, err)
	}
	return db.View(func(tx *bolt.Tx) error {
		if tx.Size() > fi.Size() {
			return fmt.Errorf("file has %d bytes, its pages need %d (truncated)", fi.Size(), tx.Size())
		}
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(b) }); err != nil {
			return fmt.Errorf("reading it failed: %w", err)
		}
		if err := segstore.CheckIndex(tx); err != nil {
			return err
		}
		if err := ledger.CheckRecords(tx); err != nil {
			return err
		}
		var first error
		for err := range tx.Check() { // drained: Check's goroutine must finish before the tx ends
			if first == nil {
				first = fmt.Errorf("consistency check: %w", err)
			}
		}
		return first
	})
}

// walk reads every key and value of b and its nested buckets.
func walk(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walk(nb)
			}
		}
		return nil
	})
}

// moveAside renames path to path.damaged-<UTC time> (with -N appended if
// that exists) and returns the new path.
func moveAside(path string, now time.Time) (string, error) {
	base := path + ".damaged-" + now.UTC().Format("20060102T150405Z")
	to := base
	for i := 1; ; i++ {
		_, err := os.Lstat(to)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return "", err
		}
		to = fmt.Sprintf("%s-%d", base, i)
	}
	return to, os.Rename(path, to)
}

// reportRepairs logs what the start-up checks repaired and counts it in
// edged_storage_repairs_total{action}, so an alert can fire on a node that
// had to repair itself (a device whose storage is failing does it again).
func (d *Daemon) reportRepairs() {
	rep := d.store.Recovered()
	counts := map[string]int{
		"removed_temp": len(rep.RemovedTemp), "removed_orphan": len(rep.RemovedOrphans),
		"dropped_entry": len(rep.DroppedEntries), "quarantined": len(rep.Quarantined),
		"rebuilt": len(rep.Rebuilt), "rebuilt_unverified": len(rep.Unverified),
	}
	if d.dbRepair.MovedAside != "" {
		counts["db_moved_aside"] = 1
	}
	for action, n := range counts {
		d.met.repairs.WithLabelValues(action).Add(float64(n))
	}
	if rep.Verified > 0 {
		d.log.Info("segments verified at start", "segments", rep.Verified, "previous_stop", d.previousStop(),
			"verify_on_start", d.cfg.Storage.VerifyOnStart, "quarantined", len(rep.Quarantined))
	}
	if len(rep.RemovedTemp)+len(rep.RemovedOrphans)+len(rep.DroppedEntries) > 0 {
		d.log.Warn("segment store repaired after unclean stop",
			"removed_temp", rep.RemovedTemp, "removed_orphans", rep.RemovedOrphans, "dropped_entries", rep.DroppedEntries)
	}
	for _, q := range rep.Quarantined {
		d.log.Error("damaged segment file quarantined; it is not served", "segment", q.ID,
			"file", filepath.Join(d.cfg.Storage.Dir, segstore.QuarantineDir, q.File), "reason", q.Reason)
	}
	if len(rep.Rebuilt) > 0 || d.dbRepair.MovedAside != "" {
		d.log.Warn("segment index rebuilt from the segment files", "segments", len(rep.Rebuilt),
			"unverified", rep.Unverified, "quarantined", len(rep.Quarantined))
	}
}
