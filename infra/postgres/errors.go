package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relay-dev/relay/relaycore"
)

// Errors of Open, Migrate and Verify.
var (
	// ErrSchemaTooNew means the database's relay schema was migrated by a
	// newer release than this one. Nothing was written; run a release at
	// least as new.
	ErrSchemaTooNew = errors.New("postgres: relay schema is newer than this release")
	// ErrPermission means the role lacks a privilege the relay needs
	// (Verify). Nothing was written; grant it (docs/postgres.md,
	// Permissions).
	ErrPermission = errors.New("postgres: the relay's role lacks privileges")
)

// Errors of every Store call.
var (
	// ErrInvalidStore is returned by every call on a Store whose name is
	// empty or longer than MaxStoreNameLen. Nothing is read or written.
	ErrInvalidStore = errors.New("postgres: store name must be 1..63 bytes")
)

// checkKeys refuses written keys the B-tree indexes could not hold, before
// anything is sent, so the refusal is an ordinary invalid batch.
func checkKeys(b relaycore.Batch) error {
	for _, w := range b.Writes {
		if len(w.Key) > MaxKeyLen {
			return fmt.Errorf("%w: key of %d bytes, limit %d", relaycore.ErrInvalidBatch, len(w.Key), MaxKeyLen)
		}
	}
	return nil
}

// sendError classifies an error from Apply's one round trip, which sends
// the lock statement and the guarded write and commits at its end (see
// apply.go):
//
//   - nothing was sent (pgconn.SafeToRetry: the connection failed before
//     writing): surely not applied;
//   - the server answered a statement with an error (*pgconn.PgError): it
//     stopped there and rolled the transaction back, surely not applied;
//   - anything else (a connection lost, a context ended after sending) may
//     have come after the server committed: maybe applied.
//
// committing is true once the guarded write's result was read: from then
// on only the commit is left, and any error, even the server's, is treated
// as maybe applied, because an error reported around the commit cannot be
// told from one reported after it.
func sendError(err error, committing bool) error {
	if pgconn.SafeToRetry(err) {
		return err
	}
	var pe *pgconn.PgError
	if !committing && errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%w: %w", relaycore.ErrMaybeApplied, err)
}
