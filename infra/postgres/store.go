package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/relay-dev/relay/relaycore"
)

var (
	_ relaycore.Store       = (*Store)(nil)
	_ relaycore.DueIndex    = (*Store)(nil)
	_ relaycore.BatchGetter = (*Store)(nil)
)

// Store is the storage contract on one named store of a DB. It is safe for
// concurrent use; it holds no state beyond its name and limits.
type Store struct {
	db   *DB
	name string
	caps relaycore.Capabilities
}

// Capabilities implements relaycore.Store.
func (s *Store) Capabilities() relaycore.Capabilities { return s.caps }

// Name is the store's name, the value of relay_items.store for its items.
func (s *Store) Name() string { return s.name }

// getSQL reads one key by the whole primary key.
const getSQL = `SELECT value FROM relay_items WHERE store = $1 AND part = $2 AND key = $3`

// Get implements relaycore.Store with one statement on the primary key.
func (s *Store) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	ctx, cancel := s.db.bound(ctx)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, false, fmt.Errorf("get %s: %w", p, unavailable(err))
	}
	if !readable(p, key) {
		return nil, false, nil
	}
	e := getParams()
	defer e.release()
	var (
		v     []byte
		found bool
	)
	err := s.query(ctx, getSQL, getParamOIDs, e.encodeRead(s.name, p, key), func(row [][]byte) error {
		v, found = clone(row[0]), true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("get %s: %w", p, unavailable(err))
	}
	return v, found, nil
}

// getManySQL probes the primary key once per key (a NULL value is an
// absent key): "key = ANY(keys)" lets the planner read the whole partition
// and filter it when it believes the partition small, as it does of a new
// one.
const getManySQL = `SELECT w.k, (SELECT it.value FROM relay_items it WHERE it.store = $1 AND it.part = $2 AND it.key = w.k)
	FROM unnest($3::bytea[]) AS w(k)`

// GetMany implements relaycore.BatchGetter with one statement, so every
// key is read from one snapshot (as infra/bolt, unlike infra/dynamo).
func (s *Store) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	ctx, cancel := s.db.bound(ctx)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("get many %s: %w", p, unavailable(err))
	}
	out := make(map[string][]byte, len(keys))
	want := make([]string, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; dup || !readable(p, k) {
			continue
		}
		seen[k] = struct{}{}
		want = append(want, k)
	}
	if len(want) == 0 {
		return out, nil
	}
	e := getParams()
	defer e.release()
	err := s.query(ctx, getManySQL, getManyParamOIDs, e.encodeGetMany(s.name, p, want), func(row [][]byte) error {
		if row[1] != nil {
			out[string(row[0])] = clone(row[1])
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("get many %s: %w", p, unavailable(err))
	}
	return out, nil
}

// The statements of a Scan page, without an upper bound and with one.
// Both lower bounds go to the index (B-tree scans keep the tighter); an
// empty After (key > the empty bytea) excludes nothing, keys never being empty.
// The upper bound has its own statement so that a bounded scan of a big
// partition stops at End instead of filtering past it.
const (
	scanSQL      = `SELECT key, value FROM relay_items WHERE store = $1 AND part = $2 AND key >= $3 AND key > $4 ORDER BY key LIMIT $5`
	scanRangeSQL = `SELECT key, value FROM relay_items WHERE store = $1 AND part = $2 AND key >= $3 AND key > $4 AND key < $6 ORDER BY key LIMIT $5`
)

// Scan implements relaycore.Store: one statement on the primary key's
// order. Next is set only when another key in range follows the page (the
// statement reads one row more than the page), so the last page always
// has an empty Next.
func (s *Store) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	ctx, cancel := s.db.bound(ctx)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, unavailable(err))
	}
	if p == "" || len(p) > relaycore.MaxPartitionLen {
		return relaycore.ScanPage{}, nil
	}
	limit := req.Limit
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	e := getParams()
	defer e.release()
	sql, oids := scanSQL, scanParamOIDs
	if req.End != "" {
		sql, oids = scanRangeSQL, scanRangeParamOIDs
	}
	// The keys are gathered in one buffer and made one string, which the
	// page's keys share: one allocation for them all.
	var (
		page relaycore.ScanPage
		keys []byte
		ends []int
	)
	err := s.query(ctx, sql, oids, e.encodeScan(s.name, p, req, int64(limit)+1), func(row [][]byte) error {
		keys = append(keys, row[0]...)
		ends = append(ends, len(keys))
		page.Items = append(page.Items, relaycore.Item{Value: clone(row[1])})
		return nil
	})
	if err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, unavailable(err))
	}
	all, start := string(keys), 0
	for i, end := range ends {
		page.Items[i].Key = all[start:end]
		start = end
	}
	if len(page.Items) > limit {
		page.Items = page.Items[:limit]
		page.Next = page.Items[limit-1].Key
	}
	return page, nil
}

// query runs the prepared statement sql (prepared on first use on each
// connection, and checked to take parameters of the types oids) with
// params in binary format, calling row with each result row's values in
// binary format (NULL is nil), which are only valid during the call.
func (s *Store) query(ctx context.Context, sql string, oids []uint32, params [][]byte, row func([][]byte) error) error {
	conn, err := s.db.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sd, err := conn.Conn().Prepare(ctx, sql, sql)
	if err != nil {
		return err
	}
	if err := checkParamOIDs(sd, oids); err != nil {
		return err
	}
	rr := conn.Conn().PgConn().ExecStatement(ctx, sd, params, binaryFormat, binaryFormat)
	for rr.NextRow() {
		if err := row(rr.Values()); err != nil {
			_, _ = rr.Close()
			return err
		}
	}
	_, err = rr.Close()
	return err
}

// clone copies a value read from a result row, which pgconn reuses; an
// empty value stays non-nil.
func clone(v []byte) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return append(make([]byte, 0, len(v)), v...)
}

// Due implements relaycore.DueIndex from the partial index relay_items_due.
// It reads the primary, so it is strongly consistent (entries are hints
// all the same: the sweeper re-reads the item). limit <= 0 returns every
// entry due by before. Entries due at the same time come in (partition,
// key) byte order, as DueEntry.Compare orders them.
func (s *Store) Due(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	ctx, cancel := s.db.bound(ctx)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("due: %w", unavailable(err))
	}
	var lim any // NULL: LIMIT ALL
	if limit > 0 {
		lim = limit
	}
	rows, err := s.db.pool.Query(ctx, `SELECT part, key, due FROM relay_items
		WHERE store = $1 AND due IS NOT NULL AND due <= $2 ORDER BY due, part, key LIMIT $3`, s.name, before, lim)
	if err != nil {
		return nil, fmt.Errorf("due: %w", unavailable(err))
	}
	var (
		out     []relaycore.DueEntry
		part, k []byte
		due     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&part, &k, &due}, func() error {
		out = append(out, relaycore.DueEntry{Partition: relaycore.Partition(part), Key: string(k), Due: due})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("due: %w", unavailable(err))
	}
	return out, nil
}

// ready refuses calls that cannot proceed: a cancelled context or a store
// with an invalid name.
func (s *Store) ready(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.name == "" || len(s.name) > MaxStoreNameLen {
		return ErrInvalidStore
	}
	return nil
}

// readable reports whether a batch could have written key in p; reads of
// other keys find nothing without asking the server.
func readable(p relaycore.Partition, key string) bool {
	return p != "" && len(p) <= relaycore.MaxPartitionLen && key != "" && len(key) <= MaxKeyLen
}
