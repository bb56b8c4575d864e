package relaycore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/storetest"
)

// storeOnly hides every method but the Store ones (a wrapper without a due
// index), and may expose what it wraps.
type storeOnly struct{ relaycore.Store }

type unwrapping struct{ storeOnly }

func (u unwrapping) Unwrap() relaycore.Store { return u.Store }

// A CountingStore keeps the wrapped store's due index reachable by type
// assertion (directly or through wrappers that Unwrap), and says clearly
// when there is none.
func TestCountingStoreDueIndexPassesThrough(t *testing.T) {
	ctx := context.Background()
	inner := mem.New(relaycore.Capabilities{})
	if err := inner.Apply(ctx, "src", relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Value: []byte(`{"due_ms":5}`), Due: 5}}}); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]relaycore.Store{
		"direct":           inner,
		"through unwrap":   unwrapping{storeOnly{inner}},
		"counting counted": relaycore.NewCountingStore(inner),
	} {
		t.Run(name, func(t *testing.T) {
			c := relaycore.NewCountingStore(st)
			var s relaycore.Store = c
			d, ok := s.(relaycore.DueIndex)
			if !ok {
				t.Fatal("CountingStore hides the due index")
			}
			got, err := d.Due(ctx, 10, 10)
			if err != nil || len(got) != 1 || got[0].Partition != "src" || got[0].Key != relaycore.KeyAlarm || got[0].Due != 5 {
				t.Fatalf("Due = %+v, %v", got, err)
			}
			if c.Snapshot().DueReads != 1 {
				t.Fatalf("due reads %d, want 1", c.Snapshot().DueReads)
			}
		})
	}
	_, err := relaycore.NewCountingStore(storeOnly{inner}).Due(ctx, 10, 10)
	if !errors.Is(err, relaycore.ErrNoDueIndex) {
		t.Fatalf("Due over a store without an index: %v, want ErrNoDueIndex", err)
	}
}

// The storage contract holds for a CountingStore, and for relaycore.GetMany
// over a store without BatchGetter (one Get per key).
func TestGetManyConformance(t *testing.T) {
	t.Run("counting", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) relaycore.Store {
			return relaycore.NewCountingStore(mem.New(relaycore.Capabilities{}))
		})
	})
	t.Run("fallback", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) relaycore.Store { return storeOnly{mem.New(relaycore.Capabilities{})} })
	})
}

// getCounter counts the Gets that reach a store without BatchGetter.
type getCounter struct {
	storeOnly
	gets []string
}

func (g *getCounter) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	g.gets = append(g.gets, key)
	return g.storeOnly.Get(ctx, p, key)
}

// A CountingStore counts a GetMany as one call however many keys it reads,
// forwarding it to the wrapped store's GetMany, or to one Get per distinct
// key when the wrapped store has none.
func TestCountingStoreGetMany(t *testing.T) {
	ctx := context.Background()
	inner := mem.New(relaycore.Capabilities{})
	if err := inner.Apply(ctx, "p", relaycore.Batch{Writes: []relaycore.Write{
		{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")},
	}}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c", "a"}
	fallback := &getCounter{storeOnly: storeOnly{inner}}
	for name, st := range map[string]relaycore.Store{"batch getter": inner, "get fallback": fallback} {
		t.Run(name, func(t *testing.T) {
			c := relaycore.NewCountingStore(st)
			m, err := relaycore.GetMany(ctx, c, "p", keys)
			if err != nil || len(m) != 2 || string(m["a"]) != "1" || string(m["b"]) != "2" {
				t.Fatalf("get many = %q, %v", m, err)
			}
			if got := c.Snapshot(); got.GetManys != 1 || got.Gets != 0 || got.ItemsRead != 2 {
				t.Fatalf("counts %+v, want one GetMany, no Get, 2 items read", got)
			}
		})
	}
	if got := strings.Join(fallback.gets, ","); got != "a,b,c" {
		t.Fatalf("fallback Gets %s, want a,b,c (each distinct key once)", got)
	}
	// Failure: the error passes through and nothing is counted as read.
	ctxDone, cancel := context.WithCancel(ctx)
	cancel()
	c := relaycore.NewCountingStore(inner)
	if m, err := c.GetMany(ctxDone, "p", keys); err == nil || m != nil {
		t.Fatalf("get many with a cancelled context = %q, %v; want nil, error", m, err)
	}
	if got := c.Snapshot(); got.GetManys != 1 || got.ItemsRead != 0 {
		t.Fatalf("counts after a failure %+v", got)
	}
}
