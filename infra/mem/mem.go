// Package mem implements the relaycore storage contract in memory. It is
// the fastest correct store: the deterministic simulation and the engine's
// unit tests run on it, and the shared conformance suite proves it behaves
// like infra/bolt and infra/dynamo. Nothing survives the process.
package mem

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/relay-dev/relay/relaycore"
)

var (
	_ relaycore.Store       = (*Store)(nil)
	_ relaycore.DueIndex    = (*Store)(nil)
	_ relaycore.BatchGetter = (*Store)(nil)
)

// DefaultCapabilities mirror DynamoDB's limits so that plans proven on the
// in-memory store also fit DynamoDB.
var DefaultCapabilities = relaycore.Capabilities{
	MaxBatchItems: 100,
	MaxBatchBytes: 4 << 20,
	MaxItemBytes:  400 << 10,
	ItemOverhead:  32,
}

// Store is a map of partitions guarded by one mutex. The zero value is not
// usable; call New.
type Store struct {
	caps relaycore.Capabilities

	mu    sync.Mutex
	parts map[relaycore.Partition]*partition
	due   map[dueKey]int64
}

type partition struct {
	keys []string // sorted
	vals map[string][]byte
}

type dueKey struct {
	p   relaycore.Partition
	key string
}

// New returns an empty store with the given limits (DefaultCapabilities
// when caps is the zero value).
func New(caps relaycore.Capabilities) *Store {
	if caps == (relaycore.Capabilities{}) {
		caps = DefaultCapabilities
	}
	return &Store{caps: caps, parts: map[relaycore.Partition]*partition{}, due: map[dueKey]int64{}}
}

// Capabilities implements relaycore.Store.
func (s *Store) Capabilities() relaycore.Capabilities { return s.caps }

// Get implements relaycore.Store.
func (s *Store) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := s.parts[p]
	if pt == nil {
		return nil, false, nil
	}
	v, ok := pt.vals[key]
	if !ok {
		return nil, false, nil
	}
	return bytes.Clone(v), true, nil
}

// GetMany implements relaycore.BatchGetter. All keys are read under one
// hold of the mutex, so the result is one snapshot of the partition.
func (s *Store) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(keys))
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := s.parts[p]
	if pt == nil {
		return out, nil
	}
	for _, k := range keys {
		if v, ok := pt.vals[k]; ok {
			out[k] = cloneValue(v)
		}
	}
	return out, nil
}

// cloneValue copies a stored value; a present empty value stays non-nil.
func cloneValue(v []byte) []byte { return append([]byte{}, v...) }

// Scan implements relaycore.Store.
func (s *Store) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if err := ctx.Err(); err != nil {
		return relaycore.ScanPage{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := s.parts[p]
	if pt == nil {
		return relaycore.ScanPage{}, nil
	}
	from := req.Start
	i := sort.SearchStrings(pt.keys, from)
	if req.After != "" && req.After >= from {
		i = sort.SearchStrings(pt.keys, req.After)
		if i < len(pt.keys) && pt.keys[i] == req.After {
			i++
		}
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 1000
	}
	var page relaycore.ScanPage
	for ; i < len(pt.keys); i++ {
		k := pt.keys[i]
		if req.End != "" && k >= req.End {
			return page, nil
		}
		if len(page.Items) == limit {
			page.Next = page.Items[len(page.Items)-1].Key
			return page, nil
		}
		page.Items = append(page.Items, relaycore.Item{Key: k, Value: bytes.Clone(pt.vals[k])})
	}
	return page, nil
}

// Apply implements relaycore.Store.
func (s *Store) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.caps.Check(p, b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := s.parts[p]
	for i, pc := range b.Preconditions {
		var (
			v  []byte
			ok bool
		)
		if pt != nil {
			v, ok = pt.vals[pc.Key]
		}
		if pc.Absent && !ok {
			continue
		}
		if !pc.Absent && ok && bytes.Equal(v, pc.Value) {
			continue
		}
		return &relaycore.ConditionFailedError{Index: i, Key: pc.Key}
	}
	if pt == nil {
		pt = &partition{vals: map[string][]byte{}}
		s.parts[p] = pt
	}
	for _, w := range b.Writes {
		dk := dueKey{p, w.Key}
		if w.Delete {
			pt.del(w.Key)
			delete(s.due, dk)
			continue
		}
		pt.put(w.Key, bytes.Clone(w.Value))
		if w.Due != 0 {
			s.due[dk] = w.Due
		} else {
			delete(s.due, dk)
		}
	}
	if len(pt.keys) == 0 {
		delete(s.parts, p)
	}
	return nil
}

// Due implements relaycore.DueIndex.
func (s *Store) Due(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	var out []relaycore.DueEntry
	for k, d := range s.due {
		if d <= before {
			out = append(out, relaycore.DueEntry{Partition: k.p, Key: k.key, Due: d})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, relaycore.DueEntry.Compare)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (pt *partition) put(k string, v []byte) {
	if _, ok := pt.vals[k]; !ok {
		i := sort.SearchStrings(pt.keys, k)
		pt.keys = append(pt.keys, "")
		copy(pt.keys[i+1:], pt.keys[i:])
		pt.keys[i] = k
	}
	pt.vals[k] = v
}

func (pt *partition) del(k string) {
	if _, ok := pt.vals[k]; !ok {
		return
	}
	delete(pt.vals, k)
	i := sort.SearchStrings(pt.keys, k)
	pt.keys = append(pt.keys[:i], pt.keys[i+1:]...)
}

// Dump returns every partition's items in key order. Tests and the
// simulation use it to check invariants over the whole state.
func (s *Store) Dump() map[relaycore.Partition][]relaycore.Item {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[relaycore.Partition][]relaycore.Item, len(s.parts))
	for p, pt := range s.parts {
		items := make([]relaycore.Item, 0, len(pt.keys))
		for _, k := range pt.keys {
			items = append(items, relaycore.Item{Key: k, Value: bytes.Clone(pt.vals[k])})
		}
		out[p] = items
	}
	return out
}

// String summarises the store for failure messages.
func (s *Store) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "mem.Store{%d partitions}", len(s.parts))
	return b.String()
}
