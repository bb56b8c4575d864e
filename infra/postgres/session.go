package postgres

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres/internal/session"
)

// ConfigurePool sets, on every connection of a pool made from cfg, the
// session settings the store's statements are written for, except any
// the connection string sets itself (its value is kept). relay serve
// configures its pool with it; a pool without them works the same, at
// more of the server's CPU per call.
//
//   - plan_cache_mode=force_generic_plan: each statement is planned once
//     per connection, not for each call. Every statement is prepared,
//     and the server kept planning Apply's guarded write for each call
//     (its custom plans looked cheaper): about a tenth of a millisecond,
//     three times what running it took, and a quarter of the server's CPU
//     under relay serve.
//   - enable_seqscan=off: every statement here reads by the primary key,
//     the due index or row address, and a plan made once must not read
//     the whole table however small the table was when it was made (a
//     generic plan made on a new table deleted by a sequential scan).
//     This only prices sequential scans out where another path exists,
//     as one always does for these statements.
//
// docs/postgres.md, Sessions.
func ConfigurePool(cfg *pgxpool.Config) { session.Configure(&cfg.ConnConfig.Config) }
