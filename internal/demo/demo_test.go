package demo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	sum, err := demo.Run(context.Background(), cfg, stores, io.Discard, nil)
	if err == nil {
		t.Fatal("demo verified a target store that drops writes")
	}
	// The failed run still describes what it did.
	if sum.Verified || !strings.Contains(sum.Error, "verify") || sum.RowsEnqueued != 40 || sum.RowsDelivered < 40 || sum.Store != "bolt" {
		t.Fatalf("summary %+v", sum)
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

// errBusy is the injected transient failure of flakyStore.
var errBusy = errors.New("store busy (injected by the test)")

// flakyStore wraps a real store and fails a seeded share of the calls only
// the demo itself makes, the way DynamoDB's store fails when it runs out of
// retries: reads of row keys (only the demo's check reads them), and
// enqueues with an idempotency record (only the demo's writers make them),
// refused before they run or reported ambiguous after they committed. The
// relay's own calls are left alone: its failed alarms wait for a sweep,
// which is another test's subject.
type flakyStore struct {
	relaycore.Store
	mu    *sync.Mutex
	rng   *rand.Rand
	share float64
	n     *atomic.Int64
}

func (s *flakyStore) fail() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rng.Float64() < s.share {
		s.n.Add(1)
		return true
	}
	return false
}

func (s *flakyStore) Get(ctx context.Context, p relaycore.Partition, k string) ([]byte, bool, error) {
	if !strings.HasPrefix(k, relaycore.ReservedPrefix) && s.fail() {
		return nil, false, errBusy
	}
	return s.Store.Get(ctx, p, k)
}

func (s *flakyStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if !enqueuesIdempotently(b) {
		return s.Store.Apply(ctx, p, b)
	}
	if s.fail() {
		return errBusy
	}
	err := s.Store.Apply(ctx, p, b)
	if err == nil && s.fail() {
		return fmt.Errorf("%w: %w", errBusy, relaycore.ErrMaybeApplied)
	}
	return err
}

// enqueuesIdempotently reports whether b is an enqueue with an idempotency
// record.
func enqueuesIdempotently(b relaycore.Batch) bool {
	for _, w := range b.Writes {
		if strings.HasPrefix(w.Key, relaycore.IdemPrefix) {
			return true
		}
	}
	return false
}

// With one in twenty of its own store calls failing transiently (and some
// enqueues reported ambiguous after they committed), the demo's writers
// and checks retry what the store calls transient, and the run verifies:
// no row is lost or doubled by a retry. Without the retries the first
// failure ends the run.
func TestDemoRidesOutTransientStoreFailures(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	stores := boltStores(t)
	var (
		mu sync.Mutex
		n  atomic.Int64
	)
	rng := rand.New(rand.NewPCG(seed, 1))
	stores.Source = &flakyStore{Store: stores.Source, mu: &mu, rng: rng, share: 0.05, n: &n}
	stores.Target = &flakyStore{Store: stores.Target, mu: &mu, rng: rng, share: 0.05, n: &n}
	stores.Transient = func(err error) bool { return errors.Is(err, errBusy) }
	cfg := demo.Config{Sources: 2, Targets: 6, RowsPerSource: 200, BatchRows: 10, WritersPerSrc: 2, Seed: 5}
	cfg.WriteInterval = -1
	sum, err := demo.Run(context.Background(), cfg, stores, io.Discard, nil)
	if err != nil {
		t.Fatalf("%v\nsummary %+v", err, sum)
	}
	if !sum.Verified || sum.RowsEnqueued != 400 || sum.DemoRetries == 0 || n.Load() == 0 {
		t.Fatalf("summary %+v (%d injected failures)", sum, n.Load())
	}
}
