package postgres

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relay-dev/relay/relaycore"
)

// lockSQL takes one transaction-scoped advisory lock per key of the batch,
// in ascending order of the lock keys, so two batches that share keys wait
// for each other instead of deadlocking. PostgreSQL evaluates volatile
// output expressions after ORDER BY (since 9.6), so the locks are taken in
// the sorted order.
const lockSQL = `SELECT pg_advisory_xact_lock(h) FROM unnest($1::bigint[]) AS h ORDER BY h`

// applySQL checks every precondition and, only if all hold, writes, in one
// statement, so all of it reads one snapshot: the state before the batch,
// as the contract wants (a sub-statement does not see another's writes).
// It returns the 1-based ordinal of the first precondition found false,
// or NULL when every one held and the writes were made. Each precondition
// reads its key with a scalar sub-select on the whole primary key, which
// the planner runs once per precondition and cannot turn into a join or
// a hashed scan: as a LEFT JOIN or an EXISTS, stale statistics (a new
// store or partition looks empty) made it read the whole partition for
// each batch. A present key's value is never NULL (NOT NULL), so a NULL
// read is absence.
//
// Each put's key is found the same way, key by key: a present key is
// updated by its row address (ctid), an absent one inserted by a plain
// INSERT. The batch holds the locks of all its keys (lockSQL), so no
// other batch inserts, moves or deletes those rows meanwhile, and the
// snapshot, taken after the locks, saw every batch that held them before:
// the split cannot meet a row it did not see. It is what INSERT ... ON
// CONFLICT DO UPDATE did, at less of the server's CPU (no speculative
// insertion: its conflict pre-check and insertion token; measured in
// docs/benchmarks.md, "On PostgreSQL"). Deleted keys are found key by key
// too and deleted by row address: "key = ANY(keys)" lets the planner read
// the whole partition and filter it when it believes the partition small,
// as it does of every new one.
//
// $1 store, $2 partition; $3..$5 the preconditions (key, value, absent);
// $6..$8 the puts (key, due or 0, value); $9 the deleted keys. Their types
// are applyParamOIDs, in the order of the statement's parameters.
const applySQL = `WITH pc AS (
	SELECT t.i, t.k, t.v, t.a FROM unnest($3::bytea[], $4::bytea[], $5::bool[]) WITH ORDINALITY AS t(k, v, a, i)
), cur AS (
	SELECT pc.i, pc.v, pc.a,
		(SELECT it.value FROM relay_items it WHERE it.store = $1 AND it.part = $2 AND it.key = pc.k) AS value
	FROM pc
), failed AS (
	SELECT min(cur.i) AS i FROM cur
	WHERE CASE WHEN cur.a THEN cur.value IS NOT NULL ELSE cur.value IS DISTINCT FROM cur.v END
), put AS (
	SELECT w.k, NULLIF(w.d, 0) AS d, w.v,
		(SELECT it.ctid FROM relay_items it WHERE it.store = $1 AND it.part = $2 AND it.key = w.k) AS at
	FROM unnest($6::bytea[], $7::bigint[], $8::bytea[]) AS w(k, d, v)
	WHERE (SELECT i FROM failed) IS NULL
), ins AS (
	INSERT INTO relay_items (store, part, key, due, value)
	SELECT $1, $2, put.k, put.d, put.v FROM put WHERE put.at IS NULL
), upd AS (
	UPDATE relay_items it SET due = put.d, value = put.v FROM put WHERE put.at IS NOT NULL AND it.ctid = put.at
), del AS (
	DELETE FROM relay_items WHERE (SELECT i FROM failed) IS NULL AND ctid = ANY (ARRAY(
		SELECT (SELECT it.ctid FROM relay_items it WHERE it.store = $1 AND it.part = $2 AND it.key = d.k)
		FROM unnest($9::bytea[]) AS d(k)))
)
SELECT i FROM failed`

// Apply implements relaycore.Store in one round trip: the lock statement
// and the guarded write, pipelined in one implicit transaction at READ
// COMMITTED that commits at the pipeline's end. The locks make batches on
// common keys (of the same store and partition) run one after the other,
// and the write's snapshot is taken after the locks are held, so it sees
// every batch that held them before; a key that is absent is locked as
// surely as one that exists, which row locks (SELECT ... FOR UPDATE)
// could not do. docs/postgres.md argues why this is serializable for
// batches; errors follow sendError.
//
// The parameters are encoded here, in the protocol's binary formats
// (params.go), and sent through pgconn's pipeline: pgx would encode the
// arrays by reflection, into a buffer it shrinks after each statement.
func (s *Store) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	ctx, cancel := s.db.bound(ctx)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return fmt.Errorf("apply %s: %w", p, unavailable(err))
	}
	if err := s.caps.Check(p, b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	if err := checkKeys(b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	conn, err := s.db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("apply %s: %w", p, unavailable(err))
	}
	defer conn.Release()
	// Prepared before the pipeline (once per connection), so the pipeline
	// itself only executes: a failure to prepare is surely not applied.
	var sds [2]*pgconn.StatementDescription
	for i, sql := range []string{lockSQL, applySQL} {
		if sds[i], err = conn.Conn().Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("apply %s: prepare: %w", p, unavailable(err))
		}
	}
	if err := checkParamOIDs(sds[0], lockParamOIDs); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	if err := checkParamOIDs(sds[1], applyParamOIDs); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	e := getParams()
	defer e.release()
	e.encodeApply(s.name, p, b)
	pl := conn.Conn().PgConn().StartPipeline(ctx)
	pl.SendQueryStatement(sds[0], e.lock[:], binaryFormat, nil)
	pl.SendQueryStatement(sds[1], e.apply[:], binaryFormat, binaryFormat)
	if err := pl.Sync(); err != nil {
		_ = pl.Close()
		return fmt.Errorf("apply %s: %w", p, sendError(err, false))
	}
	if err := pipelineDone(pl); err != nil {
		_ = pl.Close()
		return fmt.Errorf("apply %s: lock: %w", p, sendError(err, false))
	}
	failed, err := pipelineFailed(pl)
	if err != nil {
		_ = pl.Close()
		return fmt.Errorf("apply %s: %w", p, sendError(err, false))
	}
	closeErr := pl.Close() // reads up to the commit's ReadyForQuery
	if failed > 0 {
		// The statement wrote nothing, whatever became of the commit.
		i := int(failed - 1)
		return fmt.Errorf("apply %s: %w", p, &relaycore.ConditionFailedError{Index: i, Key: b.Preconditions[i].Key})
	}
	if closeErr != nil {
		return fmt.Errorf("apply %s: commit: %w", p, sendError(closeErr, true))
	}
	return nil
}

// pipelineDone reads the next result of pl, a statement whose rows are
// not wanted, to its end.
func pipelineDone(pl *pgconn.Pipeline) error {
	res, err := pl.GetResults()
	if err != nil {
		return err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return fmt.Errorf("postgres: pipeline: got %T, want a statement's result", res)
	}
	_, err = rr.Close()
	return err
}

// pipelineFailed reads applySQL's result from pl: the 1-based ordinal of
// the failed precondition, or 0 when none failed (NULL).
func pipelineFailed(pl *pgconn.Pipeline) (int64, error) {
	res, err := pl.GetResults()
	if err != nil {
		return 0, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return 0, fmt.Errorf("postgres: pipeline: got %T, want the guarded write's result", res)
	}
	var failed int64
	rows := 0
	for rr.NextRow() {
		rows++
		if v := rr.Values(); len(v) == 1 && v[0] != nil {
			if len(v[0]) != 8 {
				_, _ = rr.Close()
				return 0, fmt.Errorf("postgres: the guarded write returned %d bytes, want a bigint", len(v[0]))
			}
			failed = int64(binary.BigEndian.Uint64(v[0]))
		}
	}
	if _, err := rr.Close(); err != nil {
		return 0, err
	}
	if rows != 1 {
		return 0, fmt.Errorf("postgres: the guarded write returned %d rows, want 1", rows)
	}
	return failed, nil
}

// lockKeys are the advisory lock keys of every key b names, sorted and
// distinct (appendLockKeys).
func lockKeys(store string, p relaycore.Partition, b relaycore.Batch) []int64 {
	return appendLockKeys(nil, store, p, b)
}

// appendLockKeys appends to keys the advisory lock keys of every key b
// names and returns them sorted and distinct: a 64-bit FNV-1a hash of
// (store, partition, key), each length-prefixed (uvarint) so no two
// triples encode alike. Two keys that hash alike only share a lock (they
// wait for each other); correctness does not depend on the hash, but
// replicas sharing a database must agree on it, also across releases:
// FNV is stable, and TestLockKeysStable holds these to hash/fnv's over the
// same bytes. FNV-1a is computed here, the prefix once for the batch, so
// hashing allocates nothing.
func appendLockKeys(keys []int64, store string, p relaycore.Partition, b relaycore.Batch) []int64 {
	prefix := fnvUvarint(fnvOffset64, uint64(len(store)))
	prefix = fnvAdd(prefix, store)
	prefix = fnvUvarint(prefix, uint64(len(p)))
	prefix = fnvAdd(prefix, string(p))
	start := len(keys)
	add := func(k string) {
		keys = append(keys, int64(fnvAdd(fnvUvarint(prefix, uint64(len(k))), k)))
	}
	for _, pc := range b.Preconditions {
		add(pc.Key)
	}
	for _, w := range b.Writes {
		add(w.Key)
	}
	slices.Sort(keys[start:])
	return append(keys[:start], slices.Compact(keys[start:])...)
}

// FNV-1a, 64 bits (hash/fnv's New64a).
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnvAdd(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

func fnvUvarint(h uint64, x uint64) uint64 {
	var buf [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(buf[:], x)
	for _, c := range buf[:n] {
		h ^= uint64(c)
		h *= fnvPrime64
	}
	return h
}
