package relayserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/internal/relaybackup"
	"github.com/relay-dev/relay/relaycore"
)

// store is the storage the configuration names, opened: what the rest of
// the server needs of it, whichever database holds it. Run opens it once,
// before listening, and closes it after the drain.
type store struct {
	// source holds the sources' outboxes and is the due index the sweep
	// reads; target holds the target partitions.
	source relaycore.Store
	index  relaycore.DueIndex
	target relaycore.Store
	// logAttrs describe the store in the "listening" log line (never a
	// credential).
	logAttrs []any
	// health says why the store cannot take work now, nil when it can
	// (/readyz). It is cheap and bounded: /readyz is unauthenticated.
	health func(ctx context.Context) error
	// backup answers GET /v1/admin/backup.
	backup http.Handler
	// close releases the store (files, pools).
	close func() error
	// lingerAfterCancel is how long a call may run on after its context
	// ended (PostgreSQL: pgx sends a cancel request and cuts the socket
	// cancelDeadlineDelay later), which an API request's work deadline
	// leaves room for.
	lingerAfterCancel time.Duration
}

// openBoltStores opens the bbolt file db (the sources, and the targets
// unless targets.db names a file of their own).
func openBoltStores(cfg Config, log *slog.Logger) (*store, error) {
	db, err := openBolt("db", cfg.DB)
	if err != nil {
		return nil, err
	}
	dbs, names := []*bolt.DB{db}, []string{"relay.db"}
	closeAll := func() error {
		var err error
		for _, d := range dbs {
			err = errors.Join(err, d.Close())
		}
		return err
	}
	src := db.Store(SourceTable)
	dst := db.Store(TargetTable)
	if cfg.Targets.DB != "" {
		tdb, err := openBolt("targets.db", cfg.Targets.DB)
		if err != nil {
			_ = closeAll()
			return nil, err
		}
		dbs, names = append(dbs, tdb), append(names, "targets.db")
		dst = tdb.Store(TargetTable)
	}
	files := make([]relaybackup.File, len(dbs))
	for i, d := range dbs {
		files[i] = relaybackup.File{Name: names[i], DB: d}
	}
	return &store{
		source: src, index: src, target: dst,
		logAttrs: []any{"store", "bbolt", "db", cfg.DB, "targets_db", cfg.Targets.DB},
		// A file whose commits fail (a full file system) takes no
		// enqueue (relay.db) or delivery (targets.db) until one succeeds;
		// the reason names the file, the log has the error.
		health: func(context.Context) error {
			for i, d := range dbs {
				if d.CommitErr() != nil {
					return fmt.Errorf("%s: its last commit failed (see the log)", names[i])
				}
			}
			return nil
		},
		backup: relaybackup.Handler(log, files...),
		close:  closeAll,
	}, nil
}

// openBolt opens one of the configuration's bbolt files. bbolt lets one
// process at a time hold a file and says only "timeout" when another
// does; the operator needs to hear which file and what holds it.
func openBolt(key, path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, bolt.Options{})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%s %s is locked by another process (another relay serve, or a relay command such as status or backup --db, on the same file): stop it, or give this server its own file", key, path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return db, nil
}
