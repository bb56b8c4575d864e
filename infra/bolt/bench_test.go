package bolt

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
)

// BenchmarkApply measures the store's batched-put rate against bbolt's raw
// rate for the same work: batchesPerRun transactions of 100 puts of
// 200-byte values under ascending keys (outbox rows are appended in
// sequence order). Three writers run interleaved, batch by batch, each on
// its own file, so machine noise hits them alike:
//
//   - raw: one bbolt Update of 100 Bucket.Put calls in one nested bucket;
//   - store: Store.Apply of 100 puts (limit checks, key checks, bucket
//     lookups, due-index probes per write);
//   - guarded: the engine's shape, 99 row puts plus an os compare-and-swap
//     (a precondition and a write on one key).
//
// Reported: rows/s of each and the ratios of rates store/raw and
// guarded/raw (1.0 = as fast as raw bbolt). The
// "sync" case fsyncs every commit (the default); "nosync" shows the CPU
// cost alone. Each iteration is a full run, so -benchtime 1x is meaningful.
func BenchmarkApply(b *testing.B) {
	const (
		batchSize     = 100
		valueSize     = 200
		batchesPerRun = 100
	)
	for _, noSync := range []bool{false, true} {
		name := map[bool]string{false: "sync", true: "nosync"}[noSync]
		b.Run(name, func(b *testing.B) {
			var raw, store, guarded time.Duration
			value := make([]byte, valueSize)
			for range b.N {
				dir := b.TempDir()
				rawDB, err := bbolt.Open(filepath.Join(dir, "raw.db"), 0o600, &bbolt.Options{NoSync: noSync})
				if err != nil {
					b.Fatal(err)
				}
				sdb, err := Open(filepath.Join(dir, "store.db"), Options{NoSync: noSync})
				if err != nil {
					b.Fatal(err)
				}
				gdb, err := Open(filepath.Join(dir, "guarded.db"), Options{NoSync: noSync})
				if err != nil {
					b.Fatal(err)
				}
				s, g := sdb.Store("relay"), gdb.Store("relay")
				var os []byte
				for j := range batchesPerRun {
					keys := make([][]byte, batchSize)
					puts := make([]relaycore.Write, batchSize)
					for i := range keys {
						keys[i] = fmt.Appendf(nil, "row/%016d", j*batchSize+i)
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
							return rawDB.Update(func(tx *bbolt.Tx) error {
								bk, err := tx.CreateBucketIfNotExists([]byte("relay"))
								if err != nil {
									return err
								}
								part, err := bk.CreateBucketIfNotExists([]byte("source"))
								if err != nil {
									return err
								}
								for _, k := range keys {
									if err := part.Put(k, value); err != nil {
										return err
									}
								}
								return nil
							})
						}},
						{&store, func() error { return s.Apply(b.Context(), "source", relaycore.Batch{Writes: puts}) }},
						{&guarded, func() error { return g.Apply(b.Context(), "source", gb) }},
					}
					// Rotate who goes first so none of them always pays for
					// the others' dirty pages being flushed.
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
				for _, c := range []interface{ Close() error }{rawDB, sdb, gdb} {
					if err := c.Close(); err != nil {
						b.Fatal(err)
					}
				}
			}
			rows := float64(b.N * batchesPerRun * batchSize)
			b.ReportMetric(rows/raw.Seconds(), "raw-rows/s")
			b.ReportMetric(rows/store.Seconds(), "store-rows/s")
			b.ReportMetric(rows/guarded.Seconds(), "guarded-rows/s")
			b.ReportMetric(raw.Seconds()/store.Seconds(), "store/raw")
			b.ReportMetric(raw.Seconds()/guarded.Seconds(), "guarded/raw")
		})
	}
}
