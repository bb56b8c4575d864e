package postgres

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/relay-dev/relay/relaycore"

	"github.com/jackc/pgx/v5"
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
func (s *Store) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
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
	for _, sql := range []string{lockSQL, applySQL} {
		if _, err := conn.Conn().Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("apply %s: prepare: %w", p, unavailable(err))
		}
	}
	args := s.applyArgs(p, b)
	batch := &pgx.Batch{}
	batch.Queue(lockSQL, lockKeys(s.name, p, b))
	batch.Queue(applySQL, args...)
	br := conn.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("apply %s: lock: %w", p, sendError(err, false))
	}
	var failed *int64
	if err := br.QueryRow().Scan(&failed); err != nil {
		_ = br.Close()
		return fmt.Errorf("apply %s: %w", p, sendError(err, false))
	}
	closeErr := br.Close()
	if failed != nil {
		// The statement wrote nothing, whatever became of the commit.
		i := int(*failed - 1)
		return fmt.Errorf("apply %s: %w", p, &relaycore.ConditionFailedError{Index: i, Key: b.Preconditions[i].Key})
	}
	if closeErr != nil {
		return fmt.Errorf("apply %s: commit: %w", p, sendError(closeErr, true))
	}
	return nil
}

// applyArgs are applySQL's parameters for b. Slices are never nil (pgx
// sends a nil slice as NULL) and values never nil (NOT NULL, and a NULL
// precondition value would compare as unknown).
func (s *Store) applyArgs(p relaycore.Partition, b relaycore.Batch) []any {
	pcKeys := make([][]byte, 0, len(b.Preconditions))
	pcVals := make([][]byte, 0, len(b.Preconditions))
	pcAbsent := make([]bool, 0, len(b.Preconditions))
	for _, pc := range b.Preconditions {
		pcKeys = append(pcKeys, []byte(pc.Key))
		v := pc.Value
		if v == nil || pc.Absent {
			v = []byte{}
		}
		pcVals = append(pcVals, v)
		pcAbsent = append(pcAbsent, pc.Absent)
	}
	putKeys := make([][]byte, 0, len(b.Writes))
	putDue := make([]int64, 0, len(b.Writes))
	putVals := make([][]byte, 0, len(b.Writes))
	delKeys := make([][]byte, 0)
	for _, w := range b.Writes {
		if w.Delete {
			delKeys = append(delKeys, []byte(w.Key))
			continue
		}
		v := w.Value
		if v == nil {
			v = []byte{}
		}
		putKeys = append(putKeys, []byte(w.Key))
		putDue = append(putDue, w.Due)
		putVals = append(putVals, v)
	}
	return []any{s.name, []byte(p), pcKeys, pcVals, pcAbsent, putKeys, putDue, putVals, delKeys}
}

// lockKeys are the advisory lock keys of every key b names, sorted and
// distinct: a 64-bit FNV-1a hash of (store, partition, key), each
// length-prefixed so no two triples encode alike. Two keys that hash alike
// only share a lock (they wait for each other); correctness does not
// depend on the hash, and FNV is stable across processes and releases, as
// replicas sharing a database need.
func lockKeys(store string, p relaycore.Partition, b relaycore.Batch) []int64 {
	prefix := binary.AppendUvarint(nil, uint64(len(store)))
	prefix = append(prefix, store...)
	prefix = binary.AppendUvarint(prefix, uint64(len(p)))
	prefix = append(prefix, p...)
	keys := make([]int64, 0, len(b.Preconditions)+len(b.Writes))
	buf := prefix
	add := func(k string) {
		buf = binary.AppendUvarint(buf[:len(prefix)], uint64(len(k)))
		buf = append(buf, k...)
		h := fnv.New64a()
		h.Write(buf)
		keys = append(keys, int64(h.Sum64()))
	}
	for _, pc := range b.Preconditions {
		add(pc.Key)
	}
	for _, w := range b.Writes {
		add(w.Key)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}
