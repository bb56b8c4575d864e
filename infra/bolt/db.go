package bolt

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
)

// DefaultCapabilities mirror DynamoDB's TransactWriteItems limits (100
// items, 4 MB per batch, 400 KB per item) so that batches planned against
// the embedded store also fit DynamoDB. ItemOverhead over-counts what
// infra/dynamo charges per item, which keeps that promise.
var DefaultCapabilities = relaycore.Capabilities{
	MaxBatchItems: 100,
	MaxBatchBytes: 4 << 20,
	MaxItemBytes:  400 << 10,
	ItemOverhead:  32,
}

// DefaultLockTimeout is how long Open waits for another process to release
// the file lock when Options.LockTimeout is zero.
const DefaultLockTimeout = 5 * time.Second

// Options configure Open. The zero value is the durable default.
type Options struct {
	// Capabilities are the batch limits every Store of the DB enforces.
	// Zero means DefaultCapabilities. Raise them only if the data never
	// moves to DynamoDB.
	Capabilities relaycore.Capabilities

	// LockTimeout bounds the wait for the file lock another process holds.
	// Zero means DefaultLockTimeout; negative waits forever.
	LockTimeout time.Duration

	// NoSync skips fsync at commit. A crash (of the machine, not just the
	// process) may then lose batches whose Apply returned nil, which breaks
	// the contract's promise to the engine; only simulations and
	// benchmarks of the engine's logic should set it.
	NoSync bool

	// MaxSize caps the file size in bytes (0: no cap). A batch that would
	// grow the file beyond it is refused, surely not applied, and the
	// store stays usable.
	MaxSize int

	// openFile replaces os.OpenFile; the failure tests use it to keep the
	// file handle so they can close it under bbolt and make commits fail.
	openFile func(string, int, os.FileMode) (*os.File, error)
}

// DB is one bbolt file holding any number of tables. It is safe for
// concurrent use; Close it when done.
type DB struct {
	bolt *bbolt.DB
	gc   *committer
	caps relaycore.Capabilities
}

// Open opens (creating if needed) the bbolt file at path.
func Open(path string, opts Options) (*DB, error) {
	caps := opts.Capabilities
	if caps == (relaycore.Capabilities{}) {
		caps = DefaultCapabilities
	}
	timeout := opts.LockTimeout
	switch {
	case timeout == 0:
		timeout = DefaultLockTimeout
	case timeout < 0:
		timeout = 0 // bbolt: wait forever
	}
	b, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:  timeout,
		NoSync:   opts.NoSync,
		MaxSize:  opts.MaxSize,
		OpenFile: opts.openFile,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &DB{bolt: b, gc: &committer{db: b}, caps: caps}, nil
}

// Store returns the storage contract for one table of the file. Tables
// are independent: partitions, keys and due indexes never mix. The table's
// buckets are created by its first write; reading a table never written
// finds nothing. table must be non-empty (operations report
// ErrInvalidTable otherwise).
func (db *DB) Store(table string) *Store {
	return &Store{db: db.bolt, gc: db.gc, caps: db.caps, table: []byte(table)}
}

// Path is the file's path.
func (db *DB) Path() string { return db.bolt.Path() }

// CommitErr is the error of the file's latest commit if bbolt's Commit
// failed (a full file system, an I/O error, the MaxSize cap), nil once a
// commit succeeds or before any commit. While it is set, batches that
// write to the file fail (and a server reports itself not ready), though
// reads still work; the next commit that succeeds clears it. Failures
// before the commit (a false precondition, a refused batch, a cancelled
// context) do not count: they say nothing about the file.
func (db *DB) CommitErr() error {
	if err := db.gc.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// Close releases the file. Stores of a closed DB return errors (surely not
// applied) from every call.
func (db *DB) Close() error {
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("close %s: %w", db.bolt.Path(), err)
	}
	return nil
}

// Check runs bbolt's consistency check (every page reachable once, no page
// both free and used, keys ordered) in a read transaction and returns
// every problem found, joined. Tests run it after each test; operators can
// run it on a live file.
func (db *DB) Check() error {
	var errs []error
	err := db.bolt.View(func(tx *bbolt.Tx) error {
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check %s: %w", db.bolt.Path(), err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("check %s: %w", db.bolt.Path(), errors.Join(errs...))
	}
	return nil
}
