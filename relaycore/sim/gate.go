package sim

import (
	"context"
	"runtime"
	"slices"

	"github.com/relay-dev/relay/relaycore"
)

var (
	_ relaycore.Store        = gate{}
	_ relaycore.BatchGetter  = gate{}
	_ relaycore.LooseDeleter = looseGate{}
)

// gate is the store an actor sees: every call parks the actor until the
// scheduler runs it, so exactly one store call happens at a time, in an
// order chosen by the seeded PRNG. The scheduler may answer with an
// injected failure or end the actor (a crash) before or after the call.
type gate struct {
	a      *actor
	target bool
	caps   relaycore.Capabilities
}

func (g gate) Get(_ context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	r := g.a.park(&request{op: opGet, target: g.target, p: p, key: key})
	return r.val, r.found, r.err
}

// GetMany is one scheduled call, with a Get's faults (a read may fail as a
// whole), so batch reads keep the schedule deterministic and as coarse as
// the round trip they stand for.
func (g gate) GetMany(_ context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	r := g.a.park(&request{op: opGetMany, target: g.target, p: p, keys: slices.Clone(keys)})
	return r.vals, r.err
}

func (g gate) Scan(_ context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	r := g.a.park(&request{op: opScan, target: g.target, p: p, scan: req})
	return r.page, r.err
}

func (g gate) Apply(_ context.Context, p relaycore.Partition, b relaycore.Batch) error {
	// The batch is copied so the record the checker keeps cannot be
	// changed by the caller after the call.
	b = relaycore.Batch{Preconditions: slices.Clone(b.Preconditions), Writes: slices.Clone(b.Writes)}
	return g.a.park(&request{op: opApply, target: g.target, p: p, batch: b}).err
}

func (g gate) Capabilities() relaycore.Capabilities { return g.caps }

// looseGate is the source store of a Loose scenario: a LooseDeleter, so
// fires take finished pages out through rs.gone and delete them after
// their checkpoint (relaycore's gone.go), with a fault or a crash between.
type looseGate struct{ gate }

// DeleteLoose is one scheduled call; a fault may delete some of the keys
// and fail.
func (g looseGate) DeleteLoose(_ context.Context, p relaycore.Partition, keys []string) error {
	return g.a.park(&request{op: opDeleteLoose, target: g.target, p: p, keys: slices.Clone(keys)}).err
}

// exit ends the calling actor's goroutine: a process death. Deferred calls
// in the engine still run, but the actor is marked dead first, so they
// cannot reach a store or the kicker.
func exit() { runtime.Goexit() }
