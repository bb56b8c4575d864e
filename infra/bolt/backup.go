package bolt

import (
	"errors"
	"fmt"
	"io"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrLocked is returned by CopyFile when another process holds the file
// open for writing (a running relay): copy it through that process
// instead (DB.Snapshot).
var ErrLocked = errors.New("bolt: the file is locked by another process")

// Snapshot is a consistent copy of a whole bbolt file as of the moment it
// was taken, held by a read transaction: writers go on meanwhile, and the
// pages the snapshot needs are kept until Close. A write that must grow
// the file's memory map waits for Close, so write the snapshot out and
// close it promptly.
type Snapshot struct {
	tx *bbolt.Tx
}

// Size is the number of bytes WriteTo writes.
func (s *Snapshot) Size() int64 { return s.tx.Size() }

// WriteTo writes the copy, a complete bbolt file, to w. It may be called
// more than once.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) { return s.tx.WriteTo(w) }

// Close releases the snapshot.
func (s *Snapshot) Close() error { return s.tx.Rollback() }

// Snapshots takes a snapshot of each file at one instant: while their read
// transactions begin, every file's writer lock is held, so no commit lands
// in one file's snapshot and not in another's. A relay whose source and
// target tables live in two files needs that: restored from copies taken
// at different instants, a target could hold rows of seqs its source's
// outbox has not yet given out, and the rh watermark would then skip the
// new rows that get those seqs. The writer locks are taken in argument
// order; pass the files in the same order everywhere.
func Snapshots(dbs ...*DB) ([]*Snapshot, error) {
	var writers []*bbolt.Tx
	defer func() {
		for _, w := range writers {
			_ = w.Rollback()
		}
	}()
	for _, db := range dbs {
		w, err := db.bolt.Begin(true)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", db.Path(), err)
		}
		writers = append(writers, w)
	}
	var out []*Snapshot
	for _, db := range dbs {
		tx, err := db.bolt.Begin(false)
		if err != nil {
			for _, s := range out {
				_ = s.Close()
			}
			return nil, fmt.Errorf("snapshot %s: %w", db.Path(), err)
		}
		out = append(out, &Snapshot{tx: tx})
	}
	return out, nil
}

// Snapshot takes a snapshot of the file (see Snapshots).
func (db *DB) Snapshot() (*Snapshot, error) {
	tx, err := db.bolt.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", db.Path(), err)
	}
	return &Snapshot{tx: tx}, nil
}

// CopyFile writes a consistent copy of the bbolt file at path to w,
// opening it read-only. No process may hold it open for writing: bbolt
// locks the file, and after lockTimeout (0: DefaultLockTimeout) CopyFile
// gives up with ErrLocked.
func CopyFile(path string, w io.Writer, lockTimeout time.Duration) (int64, error) {
	if lockTimeout == 0 {
		lockTimeout = DefaultLockTimeout
	}
	b, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return 0, fmt.Errorf("copy %s: %w", path, ErrLocked)
	}
	if err != nil {
		return 0, fmt.Errorf("copy %s: %w", path, err)
	}
	defer b.Close()
	var n int64
	err = b.View(func(tx *bbolt.Tx) error {
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("copy %s: %w", path, err)
	}
	return n, nil
}

// CheckFile opens the bbolt file at path read-only (it must exist and no
// process may hold it open for writing) and runs bbolt's consistency
// check on it, as Check does: for a backup before it is trusted.
func CheckFile(path string) error {
	b, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: DefaultLockTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return fmt.Errorf("check %s: %w", path, ErrLocked)
	}
	if err != nil {
		return fmt.Errorf("check %s: %w", path, err)
	}
	defer b.Close()
	return (&DB{bolt: b}).Check()
}
