package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Verify checks, without writing anything, that this release can run on
// the pool's database as the pool's role: the schema is not newer than
// SchemaVersion (ErrSchemaTooNew), and the role has the privileges the
// relay needs (ErrPermission): on a schema at SchemaVersion, SELECT,
// INSERT, UPDATE and DELETE on relay_items and SELECT on relay_schema; on
// an older or absent schema, CREATE on the schema Open will migrate it in
// (the first of the search_path). `relay serve --check-config` runs it,
// and `relay serve` before Open, so a role that could open but not write
// is refused at start rather than at its first enqueue. An error reaching
// the database is returned as it is.
func Verify(ctx context.Context, pool *pgxpool.Pool) error {
	// A role that may not read relay_schema cannot learn the version:
	// that is a missing privilege too, not the server's bare refusal.
	var exists, readable bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('relay_schema') IS NOT NULL,
		coalesce(has_table_privilege(to_regclass('relay_schema'), 'SELECT'), false)`).Scan(&exists, &readable); err != nil {
		return fmt.Errorf("postgres: verify: %w", explain(err))
	}
	v := SchemaVersion // unreadable: check the run-time privileges, which name it
	if !exists || readable {
		var err error
		if v, err = schemaVersion(ctx, pool); err != nil {
			return fmt.Errorf("postgres: verify: %w", explain(err))
		}
	}
	if v > SchemaVersion {
		return fmt.Errorf("%w: the database has schema version %d, this release knows up to %d (run a release at least as new as the one that migrated it)", ErrSchemaTooNew, v, SchemaVersion)
	}
	var missing []string
	if v < SchemaVersion {
		var schema *string
		var create bool
		if err := pool.QueryRow(ctx, `SELECT current_schema(), coalesce(has_schema_privilege(current_schema(), 'CREATE'), false)`).Scan(&schema, &create); err != nil {
			return fmt.Errorf("postgres: verify: %w", err)
		}
		switch {
		case schema == nil:
			// current_schema() skips the schemas the role may not use as
			// well as those that do not exist: say which it is.
			var unusable *string
			if err := pool.QueryRow(ctx, `SELECT min(nspname) FROM pg_namespace
				WHERE nspname = ANY (string_to_array(replace(replace(current_setting('search_path'), '"', ''), ' ', ''), ','))
				AND NOT has_schema_privilege(nspname, 'USAGE')`).Scan(&unusable); err != nil {
				return fmt.Errorf("postgres: verify: %w", err)
			}
			if unusable != nil {
				return fmt.Errorf("%w: the relay's role lacks USAGE on schema %s of the search_path, so it cannot create the relay's tables there (GRANT USAGE, CREATE ON SCHEMA %s TO the role: docs/postgres.md)", ErrPermission, *unusable, *unusable)
			}
			return fmt.Errorf("%w: no schema of the search_path exists to create the relay's tables in (create it, or set search_path in the DSN)", ErrPermission)
		case !create:
			missing = append(missing, fmt.Sprintf("CREATE on schema %s (to create or migrate the relay's tables, schema version %d -> %d)", *schema, v, SchemaVersion))
		}
	} else {
		for _, p := range []struct{ table, privs string }{
			{"relay_items", "SELECT"}, {"relay_items", "INSERT"}, {"relay_items", "UPDATE"}, {"relay_items", "DELETE"},
			{"relay_schema", "SELECT"},
		} {
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT coalesce(has_table_privilege(to_regclass($1), $2), false)`, p.table, p.privs).Scan(&ok); err != nil {
				return fmt.Errorf("postgres: verify: %w", err)
			}
			if !ok {
				missing = append(missing, p.privs+" on "+p.table)
			}
		}
	}
	if len(missing) > 0 {
		var user string
		_ = pool.QueryRow(ctx, `SELECT current_user`).Scan(&user)
		return fmt.Errorf("%w: role %s lacks %s (docs/postgres.md, Permissions)", ErrPermission, user, strings.Join(missing, ", "))
	}
	return nil
}
