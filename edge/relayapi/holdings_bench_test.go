package relayapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/segstore"
)

// BenchmarkReportPass is one holdings pass over a store of n segments that
// the relay already knows of (nothing to report): what every
// relay_api.report_interval costs edged, and every pass a store starts
// (relay_api.report_delay). The store is real (bbolt, packed segments of
// 64 bytes); RELAY_REPORT_BENCH_SEGMENTS sets n (default 100000).
func BenchmarkReportPass(b *testing.B) {
	n := 100_000
	if v := os.Getenv("RELAY_REPORT_BENCH_SEGMENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("RELAY_REPORT_BENCH_SEGMENTS=%q", v)
		}
	}
	dir := b.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	store, err := segstore.Open(filepath.Join(dir, "segments"), db, segstore.Options{QuotaSegments: int64(n) + 1,
		QuotaBytes: 1 << 40, MaxSegmentBytes: 1 << 20, PackMaxBytes: segstore.DefaultPackMaxBytes})
	if err != nil {
		b.Fatal(err)
	}
	// Concurrent writes share group commits: the fill takes seconds, not
	// minutes.
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	const writers = 64
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				body := fmt.Appendf(nil, "%064d", i)
				sum := sha256.Sum256(body)
				if _, err := store.Write(fmt.Sprintf("seg-%07d", i), int64(len(body)), hex.EncodeToString(sum[:]), bytes.NewReader(body), ""); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	cfg := config.Default().RelayAPI
	cfg.URL = "https://127.0.0.1:1" // never called: nothing is owed
	a, err := New(Options{Node: "edge-a", Config: cfg, HTTP: nil, DB: db, Store: store, Evict: nil,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	// What the relay was told: every segment held.
	for after := ""; ; {
		page, err := store.ListAfter(after, 10_000)
		if err != nil {
			b.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			for _, e := range page {
				if err := putJSON(tx.Bucket(holdingsBucket), []byte(e.ID), reported{SHA256: e.SHA256, Size: e.Size}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		after = page[len(page)-1].ID
	}
	ctx := context.Background()
	// walk: the pass every report_interval (and at start, after a
	// takedown); stored: a pass a store started, which compares only the
	// segment stored (here one the relay knows of already).
	for _, kicked := range []bool{false, true} {
		b.Run(map[bool]string{false: "walk", true: "stored"}[kicked], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if kicked {
					a.Stored("seg-0000042")
				}
				if err := a.reportPass(ctx, kicked); err != nil {
					b.Fatal(err)
				}
			}
			if p := a.holdings.status().Pending; p != 0 {
				b.Fatalf("%d reports owed, want none", p)
			}
			b.ReportMetric(float64(n), "segments")
		})
	}
}
