package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/relaycore"
)

// DefaultCapabilities are the limits this store plans batches within. They
// are PostgreSQL's, not DynamoDB's (docs/postgres.md, "Capabilities"):
//
//   - MaxBatchItems 256: every key of a batch takes one advisory lock, and
//     advisory locks live in the server's shared lock table, sized
//     max_locks_per_transaction (64) x max_connections (100) = 6400 slots
//     by default. 256 keys lets 24 connections (a pool of 8 on each of
//     three replicas) hold full batches at once within the default table;
//     a larger batch saves round trips only when one fire has that many
//     rows for one target.
//   - MaxItemBytes 1 MiB: PostgreSQL keeps large values out of line
//     (TOAST, compressed), so a big row costs no more than its bytes; the
//     bound keeps one Apply's memory on both ends predictable. Rows of up
//     to about 1 MiB can be enqueued, where DynamoDB allows 400 KB.
//   - MaxBatchBytes 8 MiB: a checkpoint or delivery of several large
//     pages in one transaction, each sent as a parameter of one statement
//     (the protocol allows 1 GB); 8 MiB bounds a batch's WAL and the
//     server's memory per statement.
//   - ItemOverhead 32: a heap tuple's fixed cost (23-byte header aligned
//     to 24, a 4-byte line pointer, 1-byte varlena headers of the store
//     name, partition, key and value). The limits above are the relay's
//     own, so the overhead only has to be stable, not exact; it stays
//     within the bound the simulation sizes rows with.
//   - UncompressedPages: nothing here is billed per KB, so DEFLATE on
//     every page the engine packs would only spend relay serve's CPU (23 %
//     of it in a profile of its throughput benchmark on this store);
//     PostgreSQL compresses long values itself (TOAST).
var DefaultCapabilities = relaycore.Capabilities{
	MaxBatchItems:     256,
	MaxBatchBytes:     8 << 20,
	MaxItemBytes:      1 << 20,
	ItemOverhead:      32,
	UncompressedPages: true,
}

// MaxKeyLen bounds a written key. The primary key (store, partition, key)
// and the due index are B-trees, whose entries PostgreSQL limits to 2704
// bytes (a third of an 8 KiB page); 2048 bytes of key leave room for the
// longest partition name (255), the store name (63) and the headers. Apply
// refuses longer keys with relaycore.ErrInvalidBatch; reads of longer keys
// find nothing.
const MaxKeyLen = 2048

// MaxStoreNameLen bounds a store name (an identifier's length in
// PostgreSQL, though the name is a value, not an identifier).
const MaxStoreNameLen = 63

// DefaultScanLimit is the page size Scan uses when the request's Limit is
// zero or negative.
const DefaultScanLimit = 1000

// Options configure Open. The zero value is the default.
type Options struct {
	// Capabilities are the limits every Store of the DB enforces. Zero
	// means DefaultCapabilities.
	Capabilities relaycore.Capabilities
	// CallTimeout, when positive, bounds each Store call and Ping on the
	// client (the call's context), whatever the caller's context allows.
	// The server's statement_timeout ends a statement the server is
	// running; it cannot end a call whose packets no longer arrive (a
	// stalled network, a frozen server), which this does: the call fails
	// as relaycore.ErrUnavailable (a write after it was sent, maybe
	// applied), and the caller answers "retry". relay serve sets it a
	// little above store.postgres.statement_timeout.
	CallTimeout time.Duration
}

// DB is a relay schema in one PostgreSQL database, holding any number of
// named stores (as a bbolt file holds tables). It is safe for concurrent
// use. It does not own the pool: close the pool when done.
type DB struct {
	pool        *pgxpool.Pool
	caps        relaycore.Capabilities
	callTimeout time.Duration
}

// bound is ctx bounded by the DB's CallTimeout, if any.
func (db *DB) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if db.callTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, db.callTimeout)
}

// Open checks the relay schema of the pool's database and creates or
// migrates it (see Migrate): a database whose schema is newer than this
// release knows is refused with ErrSchemaTooNew, and nothing is written.
// The tables live in the first schema of the connection's search_path.
func Open(ctx context.Context, pool *pgxpool.Pool, opts Options) (*DB, error) {
	caps := opts.Capabilities
	if caps == (relaycore.Capabilities{}) {
		caps = DefaultCapabilities
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, err
	}
	return &DB{pool: pool, caps: caps, callTimeout: opts.CallTimeout}, nil
}

// Ping checks that the database answers and the relay schema is the one
// this release uses (for readiness checks).
func (db *DB) Ping(ctx context.Context) error {
	ctx, cancel := db.bound(ctx)
	defer cancel()
	v, err := schemaVersion(ctx, db.pool)
	if err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	if v != SchemaVersion {
		return fmt.Errorf("postgres: ping: schema version %d, this release uses %d", v, SchemaVersion)
	}
	return nil
}

// Store returns the store named name. Stores of one DB share its tables
// and are isolated from each other by name, as bbolt tables are. The name
// must be 1..MaxStoreNameLen bytes; with any other, every call fails with
// ErrInvalidStore.
func (db *DB) Store(name string) *Store {
	return &Store{db: db, name: name, caps: db.caps}
}

// WithCapabilities returns a Store like s that plans with caps: tests and
// the simulation use smaller limits than the DB's.
func (s *Store) WithCapabilities(caps relaycore.Capabilities) *Store {
	c := *s
	c.caps = caps
	return &c
}
