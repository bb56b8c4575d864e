package demo_test

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/internal/demo"
	"github.com/relay-dev/relay/relaycore"
)

func boltStores(t *testing.T) demo.Stores {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Check(); err != nil {
			t.Errorf("bolt check: %v", err)
		}
		db.Close()
	})
	src := db.Store("source")
	return demo.Stores{Source: src, Target: db.Store("target"), Index: src, Name: "bolt"}
}

// The demo drains every outbox and its own verification passes, under both
// plans, with a failing target that recovers.
func TestDemoDrainsAndVerifies(t *testing.T) {
	for _, plan := range []string{"free", "paid"} {
		t.Run(plan, func(t *testing.T) {
			cfg := demo.Config{Plan: plan, Sources: 3, Targets: 12, RowsPerSource: 300, BatchRows: 25,
				WritersPerSrc: 2, FailingTarget: true, FailAttempts: 5, Seed: 7}
			cfg.WriteInterval = -1 // as fast as possible
			sum, err := demo.Run(context.Background(), cfg, boltStores(t), io.Discard, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !sum.Verified || sum.RowsEnqueued != 900 || sum.RowsDelivered < 900 {
				t.Fatalf("summary %+v", sum)
			}
			if sum.TargetFailures != 5 {
				t.Fatalf("injected failures = %d, want 5", sum.TargetFailures)
			}
		})
	}
}

// A wrong final state is reported: verification can fail.
func TestDemoVerificationCanFail(t *testing.T) {
	stores := boltStores(t)
	stores.Target = &droppingStore{Store: stores.Target}
	cfg := demo.Config{Sources: 1, Targets: 3, RowsPerSource: 40, BatchRows: 10, WritersPerSrc: 1, Seed: 3}
	cfg.WriteInterval = -1
	if _, err := demo.Run(context.Background(), cfg, stores, io.Discard, nil); err == nil {
		t.Fatal("demo verified a target store that drops writes")
	}
}

// droppingStore acknowledges target applies but only keeps the rh writes,
// losing every row effect.
type droppingStore struct{ relaycore.Store }

func (d *droppingStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	var keep []relaycore.Write
	for _, w := range b.Writes {
		if len(w.Key) > len(relaycore.ReservedPrefix) && w.Key[:len(relaycore.ReservedPrefix)] == relaycore.ReservedPrefix {
			keep = append(keep, w)
		}
	}
	b.Writes = keep
	return d.Store.Apply(ctx, p, b)
}
