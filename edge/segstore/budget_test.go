package segstore

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
)

// TestMemBudgetOrder: waiters are served in arrival order, a large one is
// not passed by smaller ones arriving after it, and a canceled waiter
// leaves the budget whole.
func TestMemBudgetOrder(t *testing.T) {
	b := &memBudget{size: 10}
	ctx := context.Background()
	if !b.tryTake(8) {
		t.Fatal("tryTake(8) of 10 refused")
	}
	big := make(chan error, 1)
	go func() { big <- b.take(ctx, 6) }()
	waitWaiters(t, b, 1)
	if b.tryTake(1) {
		t.Fatal("tryTake passed a waiter")
	}
	small := make(chan error, 1)
	go func() { small <- b.take(ctx, 2) }()
	waitWaiters(t, b, 2)
	canceled, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() { gone <- b.take(canceled, 1) }()
	waitWaiters(t, b, 3)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled take: %v", err)
	}
	b.give(8) // 0 used: the 6 goes first, then the 2 fits
	if err := <-big; err != nil {
		t.Fatal(err)
	}
	if err := <-small; err != nil {
		t.Fatal(err)
	}
	if u := b.inUse(); u != 8 {
		t.Fatalf("in use %d, want 8", u)
	}
	b.give(6)
	b.give(2)
	if u := b.inUse(); u != 0 || len(b.waiters) != 0 {
		t.Fatalf("in use %d, %d waiters", u, len(b.waiters))
	}
}

// waitWaiters waits until b has n waiters queued (they block on it).
func waitWaiters(t *testing.T, b *memBudget, n int) {
	t.Helper()
	for {
		b.mu.Lock()
		k := len(b.waiters)
		b.mu.Unlock()
		if k == n {
			return
		}
		if k > n {
			t.Fatalf("%d waiters, want %d", k, n)
		}
		runtime.Gosched()
	}
}

// TestStageWaitsForMemory: Stage takes its segment's bytes from the
// receive memory budget and waits while it is in use; its Commit, which
// verifies the digest, gives them back; a Stage whose context ends while
// it waits stores nothing and releases its reservation.
func TestStageWaitsForMemory(t *testing.T) {
	for _, l := range []struct {
		name string
		open func(*testing.T, string, Options) *fixture
		pack int64
	}{{"file", newStore, 0}, {"pack", newPackStore, DefaultPackMaxBytes}} {
		t.Run(l.name, func(t *testing.T) {
			opt := Options{QuotaBytes: 1 << 30, QuotaSegments: 100, MaxSegmentBytes: 1 << 20, ReceiveMemory: 100 << 10, PackMaxBytes: l.pack}
			f := l.open(t, "", opt)
			a, b := content(60<<10, 1), content(60<<10, 2)
			ra, err := f.s.Reserve("a", int64(len(a)), digest(a))
			must(t, err)
			sa, err := ra.Stage(context.Background(), "p")
			must(t, err)
			must(t, sa.Fill(bytes.NewReader(a)))
			if u := f.s.mem.inUse(); u != int64(len(a)) {
				t.Fatalf("in use %d after one Stage, want %d", u, len(a))
			}
			rb, err := f.s.Reserve("b", int64(len(b)), digest(b))
			must(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := rb.Stage(ctx, "p")
				done <- err
			}()
			waitWaiters(t, &f.s.mem, 1)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Stage while the budget is in use, canceled: %v", err)
			}
			if u := f.s.Usage(); u.ReservedBytes != int64(len(a)) {
				t.Fatalf("reserved %d after the canceled Stage, want %d", u.ReservedBytes, len(a))
			}
			if _, err := sa.Commit(); err != nil {
				t.Fatal(err)
			}
			put(t, f.s, "b", b)
			if u := f.s.mem.inUse(); u != 0 {
				t.Fatalf("in use %d after the commits", u)
			}
			checkInvariant(t, f)
		})
	}
}

// TestStageChecksum: Fill does not hash; Commit refuses content that does
// not match the reserved digest, stores nothing and gives the memory back,
// as Fill does with a stream of another length.
func TestStageChecksum(t *testing.T) {
	for _, l := range []struct {
		name string
		open func(*testing.T, string, Options) *fixture
		pack int64
	}{{"file", newStore, 0}, {"pack", newPackStore, DefaultPackMaxBytes}} {
		t.Run(l.name, func(t *testing.T) {
			f := l.open(t, "", Options{QuotaBytes: 1 << 30, QuotaSegments: 100, MaxSegmentBytes: 1 << 20, PackMaxBytes: l.pack})
			good, bad := content(5000, 1), content(5000, 2)
			r, err := f.s.Reserve("s", int64(len(good)), digest(good))
			must(t, err)
			st, err := r.Stage(context.Background(), "p")
			must(t, err)
			must(t, st.Fill(bytes.NewReader(bad)))
			if _, err := st.Commit(); !errors.Is(err, ErrChecksum) {
				t.Fatalf("Commit of wrong content: %v, want ErrChecksum", err)
			}
			if _, err := f.s.Stat("s"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Stat after refused commit: %v", err)
			}
			r, err = f.s.Reserve("t", int64(len(good)), digest(good))
			must(t, err)
			st, err = r.Stage(context.Background(), "p")
			must(t, err)
			if err := st.Fill(bytes.NewReader(good[:100])); !errors.Is(err, ErrSize) {
				t.Fatalf("Fill from a short stream: %v, want ErrSize", err)
			}
			if u, m := f.s.Usage(), f.s.mem.inUse(); u.ReservedBytes != 0 || u.Segments != 0 || m != 0 {
				t.Fatalf("usage %+v, receive memory in use %d", u, m)
			}
			put(t, f.s, "s", good)
			checkInvariant(t, f)
		})
	}
}

// TestHoldApart: what Hold hands out (QUERY and HOLDS frames) comes from a
// budget of its own: a receiver holding all of it, as one whose peer is
// slow to read its HOLDS does, does not hold up segments being staged.
func TestHoldApart(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 1 << 30, QuotaSegments: 100, MaxSegmentBytes: 1 << 20, ReceiveMemory: 1 << 20})
	release, err := f.s.Hold(context.Background(), 8<<20) // more than the budget: all of it
	must(t, err)
	if u := f.s.held.inUse(); u != 1<<20 {
		t.Fatalf("Hold of more than the budget took %d, want all %d", u, 1<<20)
	}
	b := content(60<<10, 3)
	r, err := f.s.Reserve("s", int64(len(b)), digest(b))
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Stage must not need to wait
	st, err := r.Stage(ctx, "p")
	must(t, err)
	must(t, st.Fill(bytes.NewReader(b)))
	if _, err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	release()
	release() // idempotent
	if u, h := f.s.mem.inUse(), f.s.held.inUse(); u != 0 || h != 0 {
		t.Fatalf("in use after release: staged %d, held %d", u, h)
	}
}
