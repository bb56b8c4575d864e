package postgres_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// BenchmarkApply measures the store's batched-put rate against raw
// PostgreSQL for the same rows: batchesPerRun transactions of 100 rows of
// 200-byte values under ascending keys (outbox rows are appended in
// sequence order), on the test cluster (Unix socket; fsync and
// synchronous_commit off, so the figures are CPU and round trips, not the
// disk). The writers run interleaved, batch by batch, so machine noise
// hits them alike:
//
//   - raw: BEGIN, 100 INSERTs of (k, v) into a plain table with a bytea
//     primary key, pipelined in one pgx batch, COMMIT;
//   - raw1: the same rows as one INSERT ... SELECT FROM unnest of two
//     arrays (one statement per transaction, as the store sends);
//   - store: Store.Apply of 100 puts (100 advisory locks, one statement);
//   - guarded: the engine's shape, 99 row puts plus an os compare-and-swap;
//   - single: a compare-and-swap of one key (a precondition and a put, as
//     a fire's claim is), whose figures are per batch: what a statement
//     costs before its rows.
//
// Reported: rows/s of each and the ratios store/raw, guarded/raw and
// store/raw1 (1.0 = as fast as the raw inserts), and for each writer the
// CPU per row on both sides, which the shared machine's load moves far
// less than the rates: the server's (its own connection's backend, from
// /proc/<pid>/schedstat) and this process's (the writer's goroutine is
// locked to its thread; /proc/thread-self/schedstat), and heap objects
// allocated per batch. Each iteration is a full run, so -benchtime 1x is
// meaningful.
func BenchmarkApply(b *testing.B) {
	const (
		batchSize     = 100
		valueSize     = 200
		batchesPerRun = 100
	)
	dsn := pgtest.NewDatabase(b)
	ctx := b.Context()
	// Each writer has a pool of one connection, so one backend runs all
	// of its statements; the stores' sessions are configured as relay
	// serve's.
	rawPool, rawPID := connectOne(b, dsn, false)
	raw1Pool, raw1PID := connectOne(b, dsn, false)
	storePool, storePID := connectOne(b, dsn, true)
	guardedPool, guardedPID := connectOne(b, dsn, true)
	singlePool, singlePID := connectOne(b, dsn, true)
	storeDB, err := postgres.Open(ctx, storePool, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	guardedDB, err := postgres.Open(ctx, guardedPool, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	singleDB, err := postgres.Open(ctx, singlePool, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{`CREATE TABLE raw (k bytea PRIMARY KEY, v bytea NOT NULL)`, `CREATE TABLE raw1 (k bytea PRIMARY KEY, v bytea NOT NULL)`} {
		if _, err := rawPool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	var (
		raw, raw1, store, guarded, single stats
		ms                                runtime.MemStats
	)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	thread := newCPUClock(b, 0)
	rawCPU, raw1CPU, storeCPU, guardedCPU := newCPUClock(b, rawPID), newCPUClock(b, raw1PID), newCPUClock(b, storePID), newCPUClock(b, guardedPID)
	singleCPU := newCPUClock(b, singlePID)
	value := make([]byte, valueSize)
	for n := range b.N {
		s, g := storeDB.Store(fmt.Sprintf("store%d", n)), guardedDB.Store(fmt.Sprintf("guarded%d", n))
		one := singleDB.Store(fmt.Sprintf("single%d", n))
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
				st     *stats
				server *cpuClock
				write  func() error
			}{
				{&raw, rawCPU, func() error {
					return pgx.BeginFunc(ctx, rawPool, func(tx pgx.Tx) error {
						batch := &pgx.Batch{}
						for _, k := range keys {
							batch.Queue(`INSERT INTO raw (k, v) VALUES ($1, $2)`, k, value)
						}
						return tx.SendBatch(ctx, batch).Close()
					})
				}},
				{&raw1, raw1CPU, func() error {
					_, err := raw1Pool.Exec(ctx, `INSERT INTO raw1 (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[])`, keys, values)
					return err
				}},
				{&store, storeCPU, func() error { return s.Apply(ctx, "source", relaycore.Batch{Writes: puts}) }},
				{&guarded, guardedCPU, func() error { return g.Apply(ctx, "source", gb) }},
				{&single, singleCPU, func() error {
					return one.Apply(ctx, "source", relaycore.Batch{
						Preconditions: []relaycore.Precondition{{Key: "claim", Value: os, Absent: os == nil}},
						Writes:        []relaycore.Write{{Key: "claim", Value: next}},
					})
				}},
			}
			for k := range writers {
				w := writers[(j+k)%len(writers)]
				runtime.ReadMemStats(&ms) // stops the world: outside the times
				mallocs0 := ms.Mallocs
				server0, client0 := w.server.now(b), thread.now(b)
				start := time.Now()
				err := w.write()
				w.st.wall += time.Since(start)
				w.st.client += thread.now(b) - client0
				w.st.server += w.server.now(b) - server0
				runtime.ReadMemStats(&ms)
				w.st.mallocs += ms.Mallocs - mallocs0
				if err != nil {
					b.Fatal(err)
				}
			}
			os = next
		}
	}
	rows := float64(b.N * batchesPerRun * batchSize)
	batches := float64(b.N * batchesPerRun)
	for _, w := range []struct {
		name string
		st   *stats
	}{{"raw", &raw}, {"raw1", &raw1}, {"store", &store}, {"guarded", &guarded}} {
		b.ReportMetric(rows/w.st.wall.Seconds(), w.name+"-rows/s")
		b.ReportMetric(float64(w.st.server.Nanoseconds())/rows, w.name+"-server-ns/row")
		b.ReportMetric(float64(w.st.client.Nanoseconds())/rows, w.name+"-client-ns/row")
		b.ReportMetric(float64(w.st.mallocs)/batches, w.name+"-allocs/batch")
	}
	b.ReportMetric(raw.wall.Seconds()/store.wall.Seconds(), "store/raw")
	b.ReportMetric(raw.wall.Seconds()/guarded.wall.Seconds(), "guarded/raw")
	b.ReportMetric(raw1.wall.Seconds()/store.wall.Seconds(), "store/raw1")
	b.ReportMetric(float64(single.server.Nanoseconds())/batches, "single-server-ns/batch")
	b.ReportMetric(float64(single.client.Nanoseconds())/batches, "single-client-ns/batch")
	b.ReportMetric(float64(single.wall.Nanoseconds())/batches, "single-ns/batch")
}

// connectOne opens a pool of one connection to dsn, so one backend runs
// all its statements, and returns it with that backend's pid; configure
// sets relay serve's session settings (postgres.ConfigurePool).
func connectOne(b *testing.B, dsn string, configure bool) (*pgxpool.Pool, int) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	if configure {
		postgres.ConfigurePool(cfg)
	}
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var pid int
	if err := pool.QueryRow(b.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	return pool, pid
}

// stats are one writer's totals over a benchmark's batches.
type stats struct {
	wall, server, client time.Duration
	mallocs              uint64
}

// cpuClock reads the CPU time so far of one process (a server backend)
// or thread from its schedstat (nanoseconds on CPU), without allocating,
// so reading it does not count in the allocations measured.
type cpuClock struct {
	f   *os.File
	buf [128]byte
}

// newCPUClock is the clock of process pid, or of the calling thread when
// pid is 0 (which must stay locked to it).
func newCPUClock(tb testing.TB, pid int) *cpuClock {
	path := "/proc/thread-self/schedstat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/schedstat", pid)
	}
	f, err := os.Open(path)
	if err != nil {
		tb.Skipf("no schedstat: %v", err)
	}
	tb.Cleanup(func() { f.Close() })
	return &cpuClock{f: f}
}

func (c *cpuClock) now(tb testing.TB) time.Duration {
	n, err := c.f.ReadAt(c.buf[:], 0)
	if n == 0 {
		tb.Fatalf("%s: %v", c.f.Name(), err)
	}
	var ns int64
	for _, d := range c.buf[:n] {
		if d < '0' || d > '9' {
			break
		}
		ns = ns*10 + int64(d-'0')
	}
	return time.Duration(ns)
}

// BenchmarkReads measures the store's reads on a partition of 1000 items of
// 200 bytes, through one connection configured as relay serve's: Get of
// one key, a Scan page of 100 items, GetMany of 20 keys (5 absent), each
// readsPerRun times, interleaved. Reported per call of each: the server's
// CPU (its backend's), this process's (the calling thread's) and heap
// objects allocated, as BenchmarkApply measures them.
func BenchmarkReads(b *testing.B) {
	const (
		items       = 1000
		valueSize   = 200
		readsPerRun = 300
	)
	ctx := b.Context()
	pool, pid := connectOne(b, pgtest.NewDatabase(b), true)
	db, err := postgres.Open(ctx, pool, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s := db.Store("reads")
	key := func(i int) string { return fmt.Sprintf("r/%08d", i) }
	value := make([]byte, valueSize)
	for i := 0; i < items; i += 100 {
		var ws []relaycore.Write
		for j := i; j < i+100; j++ {
			ws = append(ws, relaycore.Write{Key: key(j), Value: value})
		}
		if err := s.Apply(ctx, "p", relaycore.Batch{Writes: ws}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	thread, server := newCPUClock(b, 0), newCPUClock(b, pid)
	var (
		get, scan, getMany stats
		ms                 runtime.MemStats
	)
	for range b.N {
		for j := range readsPerRun {
			keys := make([]string, 20)
			for i := range keys {
				keys[i] = key((j*37 + i*53) % (items + items/3)) // a quarter past the end: absent
			}
			readers := []struct {
				st   *stats
				read func() error
			}{
				{&get, func() error {
					_, found, err := s.Get(ctx, "p", key(j*7%items))
					if err == nil && !found {
						err = fmt.Errorf("get %s: not found", key(j*7%items))
					}
					return err
				}},
				{&scan, func() error {
					page, err := s.Scan(ctx, "p", relaycore.ScanRequest{Start: key(j % (items - 100)), Limit: 100})
					if err == nil && len(page.Items) != 100 {
						err = fmt.Errorf("scan: %d items", len(page.Items))
					}
					return err
				}},
				{&getMany, func() error {
					_, err := s.GetMany(ctx, "p", keys)
					return err
				}},
			}
			for k := range readers {
				r := readers[(j+k)%len(readers)]
				runtime.ReadMemStats(&ms)
				mallocs0 := ms.Mallocs
				server0, client0 := server.now(b), thread.now(b)
				start := time.Now()
				err := r.read()
				r.st.wall += time.Since(start)
				r.st.client += thread.now(b) - client0
				r.st.server += server.now(b) - server0
				runtime.ReadMemStats(&ms)
				r.st.mallocs += ms.Mallocs - mallocs0
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	calls := float64(b.N * readsPerRun)
	for _, r := range []struct {
		name string
		st   *stats
	}{{"get", &get}, {"scan", &scan}, {"getmany", &getMany}} {
		b.ReportMetric(float64(r.st.wall.Nanoseconds())/calls, r.name+"-ns/call")
		b.ReportMetric(float64(r.st.server.Nanoseconds())/calls, r.name+"-server-ns/call")
		b.ReportMetric(float64(r.st.client.Nanoseconds())/calls, r.name+"-client-ns/call")
		b.ReportMetric(float64(r.st.mallocs)/calls, r.name+"-allocs/call")
	}
}
