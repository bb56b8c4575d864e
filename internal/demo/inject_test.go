package demo

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// Concurrent applies to the failing target inject exactly the failures
// asked for, never one more: the check of what is left and the count are
// one step. With a load and then an add, two applies released together
// both took the last failure (issue 19, item 17: "injected failures = 6,
// want 5").
func TestFlakyStoreInjectsExactlyFailuresUnderConcurrency(t *testing.T) {
	const rounds, appliers, failures = 200, 8, 3
	ctx := context.Background()
	for round := range rounds {
		f := &flakyStore{Store: mem.New(relaycore.Capabilities{}), target: "down", failures: failures}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, appliers)
		for i := range appliers {
			wg.Go(func() {
				<-start
				errs[i] = f.Apply(ctx, "down", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}})
			})
		}
		close(start)
		wg.Wait()
		injected := 0
		for _, err := range errs {
			switch {
			case errors.Is(err, errTargetDown):
				injected++
			case err != nil:
				t.Fatalf("round %d: apply: %v", round, err)
			}
		}
		if injected != failures || f.failed.Load() != failures {
			t.Fatalf("round %d: %d applies failed, %d counted, want %d", round, injected, f.failed.Load(), failures)
		}
	}
}
