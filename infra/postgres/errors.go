package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

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
		return unavailable(err)
	}
	var pe *pgconn.PgError
	if !committing && errors.As(err, &pe) {
		return unavailable(err)
	}
	return fmt.Errorf("%w: %w", relaycore.ErrMaybeApplied, unavailable(err))
}

// unavailable wraps err with relaycore.ErrUnavailable when it is the
// database's being out of reach or overloaded rather than the request's
// fault, so a host answers "retry later": the connection failed, was cut
// or timed out, or the server refused for the moment (its SQLSTATE says
// so: transient classes below). A caller that gave up (context.Canceled)
// and every other server error (a constraint, a privilege, a bug) stay as
// they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, relaycore.ErrUnavailable) || errors.Is(err, context.Canceled) {
		return err
	}
	if transient(err) {
		return fmt.Errorf("%w: %w", relaycore.ErrUnavailable, err)
	}
	return err
}

// transientStates are the SQLSTATEs of a server that cannot do the work
// now but may in a moment. Classes: 08 connection exception, 53
// insufficient resources (too many connections, out of memory or disk).
var transientStates = map[string]bool{
	"57P01": true, // admin_shutdown: the server is stopping
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now: starting up or in recovery
	"57014": true, // query_canceled: statement_timeout
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available: lock_timeout
	"25006": true, // read_only_sql_transaction: a standby, as during a failover
}

func transient(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "53") || transientStates[pe.Code]
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, pgconn.ErrConnClosed)
}
