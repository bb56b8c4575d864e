package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// gateGetMany makes one GetMany through a gate on a bare simulation and
// returns what the actor got, the one request the scheduler saw, and the
// trace.
func gateGetMany(t *testing.T, sc *Scenario, keys []string) (*request, *Result, map[string][]byte, error) {
	t.Helper()
	st := mem.New(relaycore.Capabilities{})
	if err := st.Apply(t.Context(), "t00", relaycore.Batch{Writes: []relaycore.Write{
		{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")},
	}}); err != nil {
		t.Fatal(err)
	}
	s := &simulation{
		ctx: t.Context(), cfg: Config{Trace: true}, sc: sc, raw: Stores{Source: st, Target: st},
		res: &Result{}, rng: rand.New(rand.NewPCG(1, 2)), now: epochMS, evts: make(chan event),
	}
	a := &actor{sim: s, name: "reader", resume: make(chan decision)}
	var (
		got map[string][]byte
		err error
	)
	go func() {
		got, err = gate{a: a, target: true}.GetMany(context.Background(), "t00", keys)
		s.evts <- event{a: a, done: true}
	}()
	ev := <-s.evts
	if ev.req == nil {
		t.Fatal("GetMany did not park the actor")
	}
	a.state, a.req = parked, ev.req
	s.step(a) // runs the call and resumes the actor until it finishes
	if a.state != finished {
		t.Fatalf("actor made more than one store call for one GetMany (state %d)", a.state)
	}
	return ev.req, s.res, got, err
}

// A batch read through the gate is one scheduled call that reads the raw
// store's keys together.
func TestGateGetManyIsOneCall(t *testing.T) {
	req, res, got, err := gateGetMany(t, &Scenario{}, []string{"a", "b", "c", "a"})
	if err != nil || len(got) != 2 || string(got["a"]) != "1" || string(got["b"]) != "2" {
		t.Fatalf("get many = %q, %v", got, err)
	}
	if req.op != opGetMany || !req.target || req.p != "t00" || len(req.keys) != 4 {
		t.Fatalf("request %+v", req)
	}
	if res.Calls != 1 || len(res.Trace) != 1 || !strings.Contains(res.Trace[0], "getm  tgt t00 a,b,c,a -> 2 of 4 found") {
		t.Fatalf("%d calls, trace %q", res.Calls, res.Trace)
	}
}

// Like a Get, a batch read may fail as a whole in chaos.
func TestGateGetManyReadFails(t *testing.T) {
	_, res, got, err := gateGetMany(t, &Scenario{ambiguousPer1000: 2000}, []string{"a"})
	if !errors.Is(err, errReadFailed) || got != nil {
		t.Fatalf("get many = %q, %v; want the injected read failure", got, err)
	}
	if res.TargetErrors != 1 {
		t.Fatalf("target errors %d, want 1", res.TargetErrors)
	}
}
