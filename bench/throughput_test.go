package bench

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/relaycore"
)

// BenchmarkBoltThroughput compares, in one run and on one disk, the rows per
// second the embedded relay delivers end to end (enqueue in batches of 100,
// then alarms until the outbox is empty: every row is written to the
// outbox, applied at its target with the rh advance, and deleted) with
// bbolt's raw batched-put rate (the same number of 200-byte values put in
// Updates of 100, fsync'd). The ratio relay/raw is the figure to watch; it
// cannot exceed about 1/3, since each row is written three times. Each
// iteration runs rounds interleaved pairs and keeps the median of each,
// so a burst of disk or CPU noise hits one round, not the figure.
func BenchmarkBoltThroughput(b *testing.B) {
	const rows, batch, targets, rounds = 4000, 100, 8, 5
	w := workload{rows: rows, batchRows: batch, targets: targets, plan: "paid"}
	var relayDurs, rawDurs []time.Duration
	for range b.N * rounds {
		dir := b.TempDir()

		rawDurs = append(rawDurs, rawPutTime(b, dir, rows, batch))

		db, err := bolt.Open(filepath.Join(dir, "relay.db"), bolt.Options{})
		if err != nil {
			b.Fatal(err)
		}
		src, dst := db.Store("source"), db.Store("target")
		h := &relaycore.RelayHandler{Source: src, Target: dst, Budget: mustBudget(b, "paid")}
		ctx := context.Background()
		start := time.Now()
		for i := 0; i < rows; i += batch {
			if _, err := (&relaycore.RelayHandler{Source: src, Clock: relaycore.SystemClock{}}).Enqueue(ctx, "src", rowsFor(w, i, batch), relaycore.EnqueueOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		delivered := 0
		for {
			res, err := h.Alarm(ctx, "src")
			if err != nil {
				b.Fatal(err)
			}
			delivered += res.RowsDelivered
			if res.Cleared {
				break
			}
		}
		relayDurs = append(relayDurs, time.Since(start))
		db.Close()
		if delivered != rows {
			b.Fatalf("delivered %d, want %d", delivered, rows)
		}
	}
	relayRate := float64(rows) / median(relayDurs).Seconds()
	rawRate := float64(rows) / median(rawDurs).Seconds()
	b.ReportMetric(relayRate, "relay-rows/s")
	b.ReportMetric(rawRate, "raw-bbolt-puts/s")
	b.ReportMetric(relayRate/rawRate, "relay/raw")
}

func mustBudget(b *testing.B, plan string) relaycore.RelayBudget {
	bu, err := relaycore.PlanBudget(plan)
	if err != nil {
		b.Fatal(err)
	}
	return bu
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
