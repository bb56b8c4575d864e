package bench

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	bbolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
)

// rawPutTime is how long bbolt takes to put rows values of valueBytes in
// fsync'd Updates of batch, in a new file in dir: the raw rate the relay's
// throughput benchmarks compare with.
func rawPutTime(b *testing.B, dir string, rows, batch int) time.Duration {
	raw, err := bbolt.Open(filepath.Join(dir, "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	v := make([]byte, valueBytes)
	start := time.Now()
	for i := 0; i < rows; i += batch {
		if err := raw.Update(func(tx *bbolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("raw"))
			if err != nil {
				return err
			}
			for j := i; j < i+batch; j++ {
				if err := bk.Put(fmt.Appendf(nil, "user/%011d", j), v); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkServeThroughput: rows per second delivered end to end through
// `relay serve` (a separate process, fsync on, plan paid, loopback HTTP
// without TLS): 1 or 4 producers each POST 100-row requests, one after
// another, to their own source, rows spread over 8 targets, and the clock
// stops when every source answers delivered-through its last seq. Against
// bbolt's raw batched-put rate (the same 4000 rows put in fsync'd Updates
// of 100) measured in the same run on the same disk, just before each
// round; medians of 5 rounds (the ratio: the median of the rounds' ratios).
func BenchmarkServeThroughput(b *testing.B) {
	bin, err := servetest.Build(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, clients := range []int{1, 4} {
		b.Run(fmt.Sprintf("producers=%d", clients), func(b *testing.B) { serveThroughput(b, bin, clients, boltStore) })
	}
}

// BenchmarkServeThroughputPostgres: the same load through one `relay serve`
// on PostgreSQL (the pgtest cluster: Unix socket, fsync and
// synchronous_commit off, so CPU and round trips, not the disk), against
// the same rows inserted raw into a plain table of the same cluster in
// transactions of 100 (BEGIN, 100 pipelined INSERTs, COMMIT), just before
// each round, each round on a new database. Also reported, read from
// pg_stat_database after relay serve stopped (its backends flush their
// counts on exit): transactions and tuples written per delivered row.
func BenchmarkServeThroughputPostgres(b *testing.B) {
	pgtest.Get(b) // skips, with the install message, without PostgreSQL
	bin, err := servetest.Build(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, clients := range []int{1, 4} {
		b.Run(fmt.Sprintf("producers=%d", clients), func(b *testing.B) { serveThroughput(b, bin, clients, postgresStore) })
	}
}

// A round's store: the raw baseline's time for rows in transactions of
// batch, the config lines putting relay serve on the same store, and its
// counts: serverCPU, called once every row is delivered, before relay
// serve stops, the CPU the database spent on relay serve's sessions (nil:
// no server), and counts, called after relay serve stopped, what the store
// counted (nil: nothing).
type roundStore struct {
	rawName string // the raw rate's metric
	round   func(b *testing.B, dir string, rows, batch int) (raw time.Duration, cfg string, c roundCounts)
}

type roundCounts struct {
	serverCPU func() time.Duration
	counts    func() map[string]float64
}

var (
	boltStore     = roundStore{"raw-bbolt-puts/s", boltRound}
	postgresStore = roundStore{"raw-pg-inserts/s", postgresRound}
)

func boltRound(b *testing.B, dir string, rows, batch int) (time.Duration, string, roundCounts) {
	return rawPutTime(b, dir, rows, batch), fmt.Sprintf("db: %s\n", filepath.Join(dir, "relay.db")), roundCounts{}
}

func postgresRound(b *testing.B, _ string, rows, batch int) (time.Duration, string, roundCounts) {
	ctx := b.Context()
	dsn := pgtest.NewDatabase(b)
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	dbName := pc.Database
	pool := pgtest.Pool(b, dsn, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE raw (k bytea PRIMARY KEY, v bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	// The round's counts: transactions and tuples written in this
	// database, and WAL written by the whole cluster (pg_stat_wal; nothing
	// else runs on it meanwhile). This pool's backend flushes its counts on
	// demand; relay serve's backends flush theirs as they exit, which may
	// be just after the process is gone: wait for them to go.
	stats := func() (commits, written, wal float64) {
		var c, w int64
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		for {
			var others int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others); err != nil {
				b.Fatal(err)
			}
			if others == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted, (SELECT wal_bytes FROM pg_stat_wal)
			FROM pg_stat_database WHERE datname = current_database()`).Scan(&c, &w, &wal); err != nil {
			b.Fatal(err)
		}
		return float64(c), float64(w), wal
	}
	_, _, rawWAL0 := stats()
	v := make([]byte, valueBytes)
	start := time.Now()
	for i := 0; i < rows; i += batch {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			q := &pgx.Batch{}
			for j := i; j < i+batch; j++ {
				q.Queue(`INSERT INTO raw (k, v) VALUES ($1, $2)`, fmt.Appendf(nil, "user/%011d", j), v)
			}
			return tx.SendBatch(ctx, q).Close()
		}); err != nil {
			b.Fatal(err)
		}
	}
	raw := time.Since(start)
	// The baseline's own counts, taken now and subtracted from the round's.
	c0, w0, wal0 := stats()
	cfg := fmt.Sprintf("store: {type: postgres, postgres: {dsn: %q}}\n", dsn)
	// The baseline's backend is one of the database's sessions: its CPU
	// so far is not relay serve's.
	own, err := pgtest.Get(b).BackendCPU(dbName)
	if err != nil {
		b.Fatal(err)
	}
	serverCPU := func() time.Duration {
		d, err := pgtest.Get(b).BackendCPU(dbName)
		if err != nil {
			b.Fatal(err)
		}
		return d - own
	}
	return raw, cfg, roundCounts{serverCPU, func() map[string]float64 {
		c1, w1, wal1 := stats()
		return map[string]float64{
			"xacts/row":         (c1 - c0 - 2) / float64(rows), // less the two stats queries
			"raw-xacts/row":     float64(rows/batch) / float64(rows),
			"tuple-writes/row":  (w1 - w0) / float64(rows),
			"wal-bytes/row":     (wal1 - wal0) / float64(rows),
			"raw-wal-bytes/row": (wal0 - rawWAL0) / float64(rows),
		}
	}}
}

func serveThroughput(b *testing.B, bin string, clients int, store roundStore) {
	const rows, batch, targets, rounds = 4000, 100, 8, 5
	var serveDurs, rawDurs, ackDurs []time.Duration
	counted := map[string][]float64{}
	for range b.N * rounds {
		dir := b.TempDir()
		raw, storeCfg, rc := store.round(b, dir, rows, batch)
		rawDurs = append(rawDurs, raw)

		cfg := "listen: 127.0.0.1:0\n" + storeCfg + "budget: {plan: paid}\nlog_level: error\nauth: {anonymous: {produce: [\"*\"], read: true}}\n"
		p := servetest.Start(b, bin, servetest.WriteConfig(b, cfg))
		client := p.Client(nil)
		w := workload{targets: targets}
		// Bodies are encoded before the clock starts: the client's JSON
		// work is not the server's.
		bodies := make([][][]byte, clients)
		for c := range clients {
			for i := c * rows / clients; i < (c+1)*rows/clients; i += batch {
				var req api.EnqueueRequest
				for _, r := range rowsFor(w, i, batch) {
					v := base64.StdEncoding.EncodeToString(payload("json", uint64(i)))
					req.Rows = append(req.Rows, api.RowJSON{Target: string(r.Target), Puts: []api.PutJSON{{Key: r.Puts[0].Key, Value: &v}}})
				}
				data, _ := json.Marshal(req)
				bodies[c] = append(bodies[c], data)
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		var ackMu sync.Mutex
		var acked time.Duration // until the last request's answer
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src := fmt.Sprintf("src-%d", c)
				var last uint64
				for _, body := range bodies[c] {
					resp, err := client.Post(p.URL+"/v1/sources/"+src+"/rows", "application/json", bytes.NewReader(body))
					if err != nil {
						errs <- err
						return
					}
					var res api.EnqueueResponse
					err = json.NewDecoder(resp.Body).Decode(&res)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 {
						errs <- fmt.Errorf("enqueue: %d %v", resp.StatusCode, err)
						return
					}
					last = res.Seqs[len(res.Seqs)-1]
				}
				ackMu.Lock()
				acked = max(acked, time.Since(start))
				ackMu.Unlock()
				// Delivery is the server's: poll the API until it says so.
				for {
					resp, err := client.Get(fmt.Sprintf("%s/v1/sources/%s/delivered-through?seq=%d", p.URL, src, last))
					if err != nil {
						errs <- err
						return
					}
					var d api.DeliveredResponse
					err = json.NewDecoder(resp.Body).Decode(&d)
					resp.Body.Close()
					if err != nil {
						errs <- err
						return
					}
					if d.Delivered {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
		}
		wg.Wait()
		serveDurs = append(serveDurs, time.Since(start))
		ackDurs = append(ackDurs, acked)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		// CPU per delivered row, relay serve's and the database's for
		// it: figures that move far less with the machine's load than
		// rows/s (the server's read before relay serve's sessions end).
		if rc.serverCPU != nil {
			counted["server-cpu-us/row"] = append(counted["server-cpu-us/row"], float64(rc.serverCPU().Microseconds())/float64(rows))
		}
		if code := p.Stop(b); code != 0 {
			b.Fatalf("relay serve exited %d", code)
		}
		counted["serve-cpu-us/row"] = append(counted["serve-cpu-us/row"], float64(p.CPU().Microseconds())/float64(rows))
		if rc.counts != nil {
			for k, v := range rc.counts() {
				counted[k] = append(counted[k], v)
			}
		}
	}
	// The ratio is taken per round, raw and served back to back, then the
	// median: the disk's fsync time drifts with whatever else runs, and a
	// pair measured together sees the same disk.
	var ratios []float64
	for i := range serveDurs {
		ratios = append(ratios, rawDurs[i].Seconds()/serveDurs[i].Seconds())
	}
	slices.Sort(ratios)
	b.ReportMetric(float64(rows)/median(serveDurs).Seconds(), "serve-rows/s")
	b.ReportMetric(float64(rows)/median(rawDurs).Seconds(), store.rawName)
	b.ReportMetric(float64(rows)/median(ackDurs).Seconds(), "acked-rows/s")
	b.ReportMetric(ratios[len(ratios)/2], "serve/raw")
	for k, vs := range counted {
		slices.Sort(vs)
		b.ReportMetric(vs[len(vs)/2], k)
	}
}
