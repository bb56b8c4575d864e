package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the version of the relay schema this release creates
// and uses: the highest migration it knows.
const SchemaVersion = 1

// migrationLock is the advisory lock key Migrate holds, so replicas that
// start together migrate once, one after the other.
const migrationLock int64 = 0x72656c6179736368 // "relaysch"

// migration is one step of the schema. A step must keep the previous
// release working (add, never drop or rename): during a rolling upgrade
// old replicas run against the migrated schema until they are replaced.
type migration struct {
	version     int
	description string
	statements  []string
}

// migrations are applied in order, each in the same transaction as the
// row that records it in relay_schema. docs/postgres.md describes the
// resulting tables.
var migrations = []migration{
	{
		version:     1,
		description: "relay_items: every store's items, keyed by store, partition and key; relay_items_due: the due index",
		statements: []string{
			// bytea compares bytewise (memcmp, then length), which is the
			// engine's key order (Go string order): no collation to get
			// wrong. STORAGE EXTERNAL would skip compressing values; row
			// pages (stored uncompressed by the engine here) compress
			// well, so the default (EXTENDED) stays.
			`CREATE TABLE relay_items (
				store text NOT NULL,
				part  bytea NOT NULL,
				key   bytea NOT NULL,
				due   bigint,
				value bytea NOT NULL,
				PRIMARY KEY (store, part, key)
			)`,
			// Partial: only alarm records carry a due time.
			`CREATE INDEX relay_items_due ON relay_items (store, due, part, key) WHERE due IS NOT NULL`,
		},
	},
}

// Migrate brings the relay schema of the pool's database to SchemaVersion
// in one transaction, under an advisory lock. A schema newer than
// SchemaVersion is refused with ErrSchemaTooNew before anything is
// written; so is an error halfway (the transaction rolls back). Open calls
// it.
//
// A replica that waited for the lock while another migrated may still see
// the schema as it was: a session refreshes its catalog cache when a
// transaction starts (and when it locks a relation), not when it gets an
// advisory lock, so a lookup of relay_schema made earlier on its
// connection (Verify's) can answer "absent" after the other committed.
// Its CREATE then fails with duplicate_table; the migration is run again
// in a new transaction, which sees what the other one did.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	var err error
	for range 3 {
		if err = migrateOnce(ctx, pool); !migratedMeanwhile(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", explain(err))
	}
	return nil
}

// migratedMeanwhile reports whether err is a migration step meeting what
// a concurrent migration created: a table or index that exists, or the
// relay_schema row of its version.
func migratedMeanwhile(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P07" || pe.Code == "42710" || pe.Code == "23505")
}

func migrateOnce(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return err
		}
		current, err := schemaVersion(ctx, tx)
		if err != nil {
			return err
		}
		if current > SchemaVersion {
			return fmt.Errorf("%w: the database has schema version %d, this release knows up to %d (run a release at least as new as the one that migrated it)", ErrSchemaTooNew, current, SchemaVersion)
		}
		if current == 0 {
			if _, err := tx.Exec(ctx, `CREATE TABLE relay_schema (
				version     integer PRIMARY KEY,
				description text NOT NULL,
				applied_at  timestamptz NOT NULL DEFAULT now()
			)`); err != nil {
				return fmt.Errorf("create relay_schema: %w", err)
			}
		}
		for _, m := range migrations {
			if m.version <= current {
				continue
			}
			for _, stmt := range m.statements {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("migration %d: %w", m.version, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO relay_schema (version, description) VALUES ($1, $2)`, m.version, m.description); err != nil {
				return fmt.Errorf("migration %d: %w", m.version, err)
			}
		}
		return nil
	})
}

// querier is what schemaVersion needs of a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// schemaVersion reads the highest recorded migration; 0 when relay_schema
// does not exist (a database the relay never used).
func schemaVersion(ctx context.Context, q querier) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('relay_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM relay_schema`).Scan(&v); err != nil {
		return 0, err
	}
	return v, nil
}

// explain adds what to do to the server errors a user can fix.
func explain(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w (the relay's role needs CREATE on its schema to create or migrate the tables, and SELECT, INSERT, UPDATE, DELETE on them: docs/postgres.md)", err)
	case "3D000": // invalid_catalog_name
		return fmt.Errorf("%w (create the database first: docs/postgres.md)", err)
	}
	return err
}
