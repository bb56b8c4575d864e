package segstore

import (
	"context"
	"sync"
)

// DefaultReceiveMemory is Options.ReceiveMemory when it is zero.
const DefaultReceiveMemory = 3 << 20

// memBudget is a receive memory budget (Options.ReceiveMemory): bytes of
// received data held in memory between receipt and commit, or what
// receivers take with Store.Hold, shared by every connection. Waiters are
// served in arrival order, so a large request (a QUERY's) is not starved by
// a stream of small ones.
type memBudget struct {
	mu      sync.Mutex
	size    int64
	used    int64
	waiters []*memWaiter
}

type memWaiter struct {
	n     int64
	ready chan struct{} // closed when granted
}

// clamp bounds a request to the whole budget, so that a request larger
// than the budget waits for all of it instead of forever.
func (b *memBudget) clamp(n int64) int64 { return min(n, b.size) }

// tryTake takes n bytes if they are free now and nobody waits.
func (b *memBudget) tryTake(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) > 0 || b.used+n > b.size {
		return false
	}
	b.used += n
	return true
}

// take waits until n bytes (at most the budget's size: see clamp) are
// free, or ctx ends.
func (b *memBudget) take(ctx context.Context, n int64) error {
	if b.tryTake(n) {
		return nil
	}
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.used += n
		b.mu.Unlock()
		return nil
	}
	w := &memWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted meanwhile: give it back
		b.used -= n
		b.grantLocked()
	default:
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
		b.grantLocked() // the next waiter may fit now
	}
	return ctx.Err()
}

// give returns n bytes taken by tryTake or take.
func (b *memBudget) give(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.grantLocked()
}

// grantLocked serves waiters in order while the first one fits.
func (b *memBudget) grantLocked() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.size {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}

// inUse is the bytes taken now.
func (b *memBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Hold takes n bytes for a buffer the caller is about to fill with what a
// peer sent (the daemon's QUERY and HOLDS frames), waiting while ctx
// allows; release gives them back. They come from a budget of their own,
// of Options.ReceiveMemory bytes too: a peer slow to read its HOLDS holds
// that budget for as long as the write takes, and must not hold up the
// segments other peers send meanwhile. A request larger than the budget
// waits for all of it, so the budget bounds what the holders of it have in
// memory together, whatever the number of connections.
func (s *Store) Hold(ctx context.Context, n int64) (release func(), err error) {
	n = s.held.clamp(n)
	if err := s.held.take(ctx, n); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { s.held.give(n) }) }, nil
}
