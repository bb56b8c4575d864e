package relaycore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
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
