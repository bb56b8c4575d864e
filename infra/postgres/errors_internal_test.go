package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relay-dev/relay/relaycore"
)

// The errors of a database out of reach or refusing for the moment wrap
// relaycore.ErrUnavailable (a host answers "retry later"); the request's
// own faults and a caller that gave up do not. Apply's surely-not-applied
// and maybe-applied classes are kept.
func TestUnavailable(t *testing.T) {
	for _, c := range []struct {
		err         error
		unavailable bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true}, // admin_shutdown
		{&pgconn.PgError{Code: "57P03"}, true}, // cannot_connect_now
		{&pgconn.PgError{Code: "08006"}, true}, // connection_failure
		{&pgconn.PgError{Code: "53300"}, true}, // too_many_connections
		{&pgconn.PgError{Code: "57014"}, true}, // statement_timeout
		{&pgconn.PgError{Code: "25006"}, true}, // a standby
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "42501"}, false}, // insufficient_privilege
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{errors.New("cannot scan"), false},
	} {
		if got := errors.Is(unavailable(c.err), relaycore.ErrUnavailable); got != c.unavailable {
			t.Errorf("unavailable(%v): %v, want %v", c.err, got, c.unavailable)
		}
	}
	shutdown := &pgconn.PgError{Code: "57P01"}
	if err := sendError(shutdown, false); relaycore.MayBeApplied(err) || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Errorf("a refused statement: %v; want surely not applied, unavailable", err)
	}
	if err := sendError(io.ErrUnexpectedEOF, true); !relaycore.MayBeApplied(err) || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Errorf("a connection lost at the commit: %v; want maybe applied, unavailable", err)
	}
}
