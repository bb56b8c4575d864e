// Package postgres implements the relaycore storage contract on PostgreSQL
// through pgx (github.com/jackc/pgx/v5, a pgxpool.Pool the caller owns).
//
// # Mapping
//
// One table, relay_items, holds every store of a DB: a row per item, keyed
// (store, part, key), with the value and, for alarm records, the due time.
// Partitions and keys are bytea, which compares bytewise: the engine's key
// order with no collation involved. The partial index relay_items_due
// serves DueIndex. The schema is created and versioned by the relay
// itself (Migrate, relay_schema); docs/postgres.md describes it and is the
// contract operators rely on.
//
//   - Get, GetMany and Scan are one statement each on the primary key, so
//     GetMany and a Scan page read one snapshot.
//   - Apply is one round trip: an advisory lock per key of the batch,
//     then one statement that checks the preconditions and writes only if
//     they all hold, in one implicit READ COMMITTED transaction.
//   - Due reads relay_items_due on the primary: strongly consistent.
//
// # Errors
//
// Apply's errors follow relaycore.Store's rules: a *ConditionFailedError
// and every error before the pipeline is sent or answered by the server
// with an error mean surely not applied; a connection lost or a context
// ended once the pipeline may have reached its commit means maybe applied
// (relaycore.ErrMaybeApplied). See sendError. Every call's error of the
// database being out of reach or refusing for the moment (a connection
// refused, cut or timed out; SQLSTATE classes 08 and 53, a shutdown, a
// recovery, a statement or lock timeout, a standby) also wraps
// relaycore.ErrUnavailable, alone or with ErrMaybeApplied. See unavailable.
package postgres
