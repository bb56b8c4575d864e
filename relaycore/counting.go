package relaycore

import (
	"context"
	"fmt"
	"sync/atomic"
)

var (
	_ Store       = (*CountingStore)(nil)
	_ DueIndex    = (*CountingStore)(nil)
	_ BatchGetter = (*CountingStore)(nil)
)

// CountingStore wraps a Store and counts its calls, items and bytes with
// atomic counters, for the demo's summary and the benchmarks. It changes
// nothing else: errors and results pass through.
//
// It implements DueIndex so that wrapping a store does not hide its due
// index from a sweeper that finds it by type assertion: Due passes through
// to the wrapped store's (found by type assertion, following Unwrap() Store
// through further wrappers) and fails with ErrNoDueIndex when there is none.
// It implements BatchGetter for the same reason, counting one call however
// many keys it reads; over a store without GetMany it falls back to Gets
// (see GetMany), which then count as that one GetMany call.
type CountingStore struct {
	inner Store

	Gets, Scans, Applies atomic.Int64
	// GetManys counts GetMany calls (one per call, not per key).
	GetManys atomic.Int64
	// DueReads counts Due calls.
	DueReads atomic.Int64
	// ApplyFailures counts Apply calls that returned an error.
	ApplyFailures atomic.Int64
	// ItemsRead counts items returned by Get (found), GetMany and Scan.
	ItemsRead atomic.Int64
	// ItemsWritten counts writes in Apply calls that succeeded.
	ItemsWritten atomic.Int64
	// BytesWritten sums Capabilities.ItemSize over those writes.
	BytesWritten atomic.Int64
}

// NewCountingStore wraps st.
func NewCountingStore(st Store) *CountingStore { return &CountingStore{inner: st} }

// Unwrap returns the wrapped store (e.g. to reach its DueIndex).
func (c *CountingStore) Unwrap() Store { return c.inner }

// Get implements Store.
func (c *CountingStore) Get(ctx context.Context, p Partition, key string) ([]byte, bool, error) {
	c.Gets.Add(1)
	v, ok, err := c.inner.Get(ctx, p, key)
	if ok {
		c.ItemsRead.Add(1)
	}
	return v, ok, err
}

// GetMany implements BatchGetter: one counted call, forwarded to the
// wrapped store's GetMany or, without one, to its Get per key.
func (c *CountingStore) GetMany(ctx context.Context, p Partition, keys []string) (map[string][]byte, error) {
	c.GetManys.Add(1)
	m, err := GetMany(ctx, c.inner, p, keys)
	c.ItemsRead.Add(int64(len(m)))
	return m, err
}

// Scan implements Store.
func (c *CountingStore) Scan(ctx context.Context, p Partition, req ScanRequest) (ScanPage, error) {
	c.Scans.Add(1)
	pg, err := c.inner.Scan(ctx, p, req)
	c.ItemsRead.Add(int64(len(pg.Items)))
	return pg, err
}

// Apply implements Store.
func (c *CountingStore) Apply(ctx context.Context, p Partition, b Batch) error {
	c.Applies.Add(1)
	err := c.inner.Apply(ctx, p, b)
	if err != nil {
		c.ApplyFailures.Add(1)
		return err
	}
	caps := c.inner.Capabilities()
	c.ItemsWritten.Add(int64(len(b.Writes)))
	for _, w := range b.Writes {
		c.BytesWritten.Add(int64(caps.ItemSize(p, w.Key, len(w.Value))))
	}
	return nil
}

// Due implements DueIndex by passing through to the wrapped store's due
// index; without one it returns an error wrapping ErrNoDueIndex.
func (c *CountingStore) Due(ctx context.Context, before int64, limit int) ([]DueEntry, error) {
	c.DueReads.Add(1)
	d, ok := dueIndexOf(c.inner)
	if !ok {
		return nil, fmt.Errorf("due %d: %w", before, ErrNoDueIndex)
	}
	return d.Due(ctx, before, limit)
}

// dueIndexOf finds st's due index: st itself, or what it wraps.
func dueIndexOf(st Store) (DueIndex, bool) {
	for range 16 { // wrappers nest a few deep; a cycle must not hang
		if d, ok := st.(DueIndex); ok {
			return d, true
		}
		u, ok := st.(interface{ Unwrap() Store })
		if !ok {
			return nil, false
		}
		st = u.Unwrap()
	}
	return nil, false
}

// Capabilities implements Store.
func (c *CountingStore) Capabilities() Capabilities { return c.inner.Capabilities() }

// Snapshot returns the counters' current values.
func (c *CountingStore) Snapshot() StoreCounts {
	return StoreCounts{
		Gets: c.Gets.Load(), GetManys: c.GetManys.Load(), Scans: c.Scans.Load(), Applies: c.Applies.Load(),
		DueReads:      c.DueReads.Load(),
		ApplyFailures: c.ApplyFailures.Load(), ItemsRead: c.ItemsRead.Load(),
		ItemsWritten: c.ItemsWritten.Load(), BytesWritten: c.BytesWritten.Load(),
	}
}

// StoreCounts is a copy of a CountingStore's counters.
type StoreCounts struct {
	Gets, GetManys, Scans, Applies        int64
	ApplyFailures, DueReads               int64
	ItemsRead, ItemsWritten, BytesWritten int64
}
