package takedowns_test

import (
	"context"
	"math/rand/v2"

	"github.com/relay-dev/relay/relaycore"
)

// sched interleaves concurrent owner passes deterministically: each pass
// runs in a goroutine of its own (an actor) and parks before every store
// call until the model, drawing from its seeded generator, gives it the
// turn. One goroutine runs at a time (the model's, or the actor it let
// go), so the interleaving, and the faults injected, depend only on the
// seed, while the passes still meet each other between any two store
// calls, as relay serve replicas or concurrent Lambda invocations do.
type sched struct {
	rng    *rand.Rand
	parked chan *actor
	actors []*actor
}

type actor struct {
	turn chan struct{}
	done bool
	err  error
}

type actorKey struct{}

// gated parks the calling actor (its context names it) before each call
// to the store; calls from the model's own goroutine go straight through.
type gated struct {
	relaycore.Store
	s *sched
}

func (g *gated) park(ctx context.Context) {
	if a, ok := ctx.Value(actorKey{}).(*actor); ok {
		g.s.parked <- a
		<-a.turn
	}
}

func (g *gated) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	g.park(ctx)
	return g.Store.Get(ctx, p, key)
}

func (g *gated) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	g.park(ctx)
	return g.Store.Scan(ctx, p, req)
}

func (g *gated) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	g.park(ctx)
	return g.Store.Apply(ctx, p, b)
}

// start runs f as a new actor, up to its first store call.
func (s *sched) start(ctx context.Context, f func(ctx context.Context) error) {
	a := &actor{turn: make(chan struct{})}
	go func() {
		err := f(context.WithValue(ctx, actorKey{}, a))
		a.done, a.err = true, err
		s.parked <- a
	}()
	s.wait(a)
}

// wait takes a's next park (or its end); a finished actor leaves the list
// and its error goes to s.finished.
func (s *sched) wait(a *actor) {
	if got := <-s.parked; got != a {
		panic("sched: an actor ran out of turn")
	}
	if !a.done {
		for _, b := range s.actors {
			if b == a {
				return
			}
		}
		s.actors = append(s.actors, a)
		return
	}
	for i, b := range s.actors {
		if b == a {
			s.actors = append(s.actors[:i], s.actors[i+1:]...)
			break
		}
	}
}

// step lets one actor, drawn at random, make its store call and run to the
// next one (or to its end); it returns the actor, finished or not.
func (s *sched) step() *actor {
	if len(s.actors) == 0 {
		return nil
	}
	a := s.actors[s.rng.IntN(len(s.actors))]
	a.turn <- struct{}{}
	s.wait(a)
	return a
}
