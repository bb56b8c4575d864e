package postgres_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// BenchmarkApply measures the store's batched-put rate against raw
// PostgreSQL for the same rows: batchesPerRun transactions of 100 rows of
// 200-byte values under ascending keys (outbox rows are appended in
// sequence order), on the test cluster (Unix socket; fsync and
// synchronous_commit off, so the figures are CPU and round trips, not the
// disk). Three writers run interleaved, batch by batch, so machine noise
// hits them alike:
//
//   - raw: BEGIN, 100 INSERTs of (k, v) into a plain table with a bytea
//     primary key, pipelined in one pgx batch, COMMIT;
//   - raw1: the same rows as one INSERT ... SELECT FROM unnest of two
//     arrays (one statement per transaction, as the store sends);
//   - store: Store.Apply of 100 puts (100 advisory locks, one statement);
//   - guarded: the engine's shape, 99 row puts plus an os compare-and-swap.
//
// Reported: rows/s of each and the ratios store/raw, guarded/raw and
// store/raw1 (1.0 = as fast as the raw inserts). Each iteration is a full run, so -benchtime
// 1x is meaningful.
func BenchmarkApply(b *testing.B) {
	const (
		batchSize     = 100
		valueSize     = 200
		batchesPerRun = 100
	)
	pool := pgtest.Pool(b, pgtest.NewDatabase(b), 2)
	ctx := b.Context()
	db, err := postgres.Open(ctx, pool, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{`CREATE TABLE raw (k bytea PRIMARY KEY, v bytea NOT NULL)`, `CREATE TABLE raw1 (k bytea PRIMARY KEY, v bytea NOT NULL)`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	var raw, raw1, store, guarded time.Duration
	value := make([]byte, valueSize)
	for n := range b.N {
		s, g := db.Store(fmt.Sprintf("store%d", n)), db.Store(fmt.Sprintf("guarded%d", n))
		var os []byte
		for j := range batchesPerRun {
			keys := make([][]byte, batchSize)
			values := make([][]byte, batchSize)
			puts := make([]relaycore.Write, batchSize)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "%d/row/%016d", n, j*batchSize+i)
				values[i] = value
				puts[i] = relaycore.Write{Key: string(keys[i]), Value: value}
			}
			next := []byte(strconv.Itoa(j + 1))
			gb := relaycore.Batch{
				Preconditions: []relaycore.Precondition{{Key: "os", Value: os, Absent: os == nil}},
				Writes:        append(puts[:batchSize-1:batchSize-1], relaycore.Write{Key: "os", Value: next}),
			}
			writers := []struct {
				spent *time.Duration
				write func() error
			}{
				{&raw, func() error {
					return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						batch := &pgx.Batch{}
						for _, k := range keys {
							batch.Queue(`INSERT INTO raw (k, v) VALUES ($1, $2)`, k, value)
						}
						return tx.SendBatch(ctx, batch).Close()
					})
				}},
				{&raw1, func() error {
					_, err := pool.Exec(ctx, `INSERT INTO raw1 (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[])`, keys, values)
					return err
				}},
				{&store, func() error { return s.Apply(ctx, "source", relaycore.Batch{Writes: puts}) }},
				{&guarded, func() error { return g.Apply(ctx, "source", gb) }},
			}
			for k := range writers {
				w := writers[(j+k)%len(writers)]
				start := time.Now()
				err := w.write()
				*w.spent += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
			}
			os = next
		}
	}
	rows := float64(b.N * batchesPerRun * batchSize)
	b.ReportMetric(rows/raw.Seconds(), "raw-rows/s")
	b.ReportMetric(rows/raw1.Seconds(), "raw1-rows/s")
	b.ReportMetric(rows/store.Seconds(), "store-rows/s")
	b.ReportMetric(rows/guarded.Seconds(), "guarded-rows/s")
	b.ReportMetric(raw.Seconds()/store.Seconds(), "store/raw")
	b.ReportMetric(raw.Seconds()/guarded.Seconds(), "guarded/raw")
	b.ReportMetric(raw1.Seconds()/store.Seconds(), "store/raw1")
}
