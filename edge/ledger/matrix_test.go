package ledger

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// start states of the matrix. Each setup leaves record ("s", "p") in the
// named state; ops then run at tOp.
var tOp = t0.Add(10 * time.Second)

type startState struct {
	name  string
	state State // 0 = absent
	setup func(t *testing.T, l *Ledger)
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func schedule(t *testing.T, l *Ledger) {
	must[[]string](t)(l.EnsureScheduled("s", []string{"p"}, t0))
}

func claim(t *testing.T, l *Ledger) {
	schedule(t, l)
	if _, ok, err := l.TryTransitionInflight("s", "p", t0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
}

func failWith(p Policy) func(t *testing.T, l *Ledger) {
	return func(t *testing.T, l *Ledger) {
		claim(t, l)
		must[Record](t)(l.TransitionFailed("s", "p", errors.New("boom"), t0, p))
	}
}

var starts = []startState{
	{"absent", 0, func(*testing.T, *Ledger) {}},
	{"scheduled", StateScheduled, schedule},
	{"inflight", StateInflight, claim},
	{"acked", StateAcked, func(t *testing.T, l *Ledger) {
		claim(t, l)
		must[Record](t)(l.TransitionAcked("s", "p", t0))
	}},
	{"failed-ready", StateFailed, failWith(Policy{MaxRetries: 3, Initial: time.Second, Max: time.Second})},
	{"failed-waiting", StateFailed, failWith(Policy{MaxRetries: 3, Initial: time.Hour, Max: time.Hour})},
	{"deadletter", StateDeadletter, failWith(Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second})},
}

type outcome struct {
	state   State // after the op; 0 = absent
	err     error // nil, ErrNotFound or ErrIllegalTransition
	claimed bool  // TryTransitionInflight only
}

type op struct {
	name string
	run  func(l *Ledger) (claimed bool, err error)
	// want maps a start state name to the outcome.
	want map[string]outcome
}

var (
	absent  = outcome{}
	sched   = outcome{state: StateScheduled}
	infl    = outcome{state: StateInflight}
	acked   = outcome{state: StateAcked}
	failedO = outcome{state: StateFailed}
	dead    = outcome{state: StateDeadletter}
)

func illegal(s State) outcome { return outcome{state: s, err: ErrIllegalTransition} }

var notFound = outcome{err: ErrNotFound}

var ops = []op{
	{"EnsureScheduled", func(l *Ledger) (bool, error) {
		_, err := l.EnsureScheduled("s", []string{"p"}, tOp)
		return false, err
	}, map[string]outcome{
		"absent": sched, "scheduled": sched, "inflight": infl, "acked": acked,
		"failed-ready": failedO, "failed-waiting": failedO, "deadletter": dead,
	}},
	{"TryTransitionInflight", func(l *Ledger) (bool, error) {
		_, ok, err := l.TryTransitionInflight("s", "p", tOp)
		return ok, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": {state: StateInflight, claimed: true}, "inflight": infl,
		"acked": illegal(StateAcked), "failed-ready": {state: StateInflight, claimed: true},
		"failed-waiting": failedO, "deadletter": illegal(StateDeadletter),
	}},
	{"TransitionAcked", func(l *Ledger) (bool, error) {
		_, err := l.TransitionAcked("s", "p", tOp)
		return false, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": illegal(StateScheduled), "inflight": acked,
		"acked": illegal(StateAcked), "failed-ready": illegal(StateFailed),
		"failed-waiting": illegal(StateFailed), "deadletter": illegal(StateDeadletter),
	}},
	{"TransitionFailed", func(l *Ledger) (bool, error) {
		_, err := l.TransitionFailed("s", "p", errors.New("x"), tOp, testPolicy)
		return false, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": illegal(StateScheduled), "inflight": failedO,
		"acked": illegal(StateAcked), "failed-ready": illegal(StateFailed),
		"failed-waiting": illegal(StateFailed), "deadletter": illegal(StateDeadletter),
	}},
	{"Postpone", func(l *Ledger) (bool, error) {
		_, err := l.Postpone("s", "p", errors.New("quota"), tOp.Add(time.Minute), tOp)
		return false, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": illegal(StateScheduled), "inflight": failedO,
		"acked": illegal(StateAcked), "failed-ready": illegal(StateFailed),
		"failed-waiting": illegal(StateFailed), "deadletter": illegal(StateDeadletter),
	}},
	{"RetryDeadletter", func(l *Ledger) (bool, error) {
		_, err := l.RetryDeadletter("s", "p", tOp)
		return false, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": illegal(StateScheduled), "inflight": illegal(StateInflight),
		"acked": illegal(StateAcked), "failed-ready": illegal(StateFailed),
		"failed-waiting": illegal(StateFailed), "deadletter": sched,
	}},
	{"Purge", func(l *Ledger) (bool, error) {
		_, err := l.Purge("s", "p")
		return false, err
	}, map[string]outcome{
		"absent": notFound, "scheduled": illegal(StateScheduled), "inflight": illegal(StateInflight),
		"acked": illegal(StateAcked), "failed-ready": illegal(StateFailed),
		"failed-waiting": illegal(StateFailed), "deadletter": absent,
	}},
	{"InflightToFailed", func(l *Ledger) (bool, error) {
		_, err := l.InflightToFailed(tOp, testPolicy)
		return false, err
	}, map[string]outcome{
		"absent": absent, "scheduled": sched, "inflight": failedO, "acked": acked,
		"failed-ready": failedO, "failed-waiting": failedO, "deadletter": dead,
	}},
	{"PruneMissing(gone)", func(l *Ledger) (bool, error) {
		_, err := l.PruneMissing(func(string) bool { return false }, tOp)
		return false, err
	}, map[string]outcome{
		"absent": absent, "scheduled": dead, "inflight": dead, "acked": acked,
		"failed-ready": dead, "failed-waiting": dead, "deadletter": dead,
	}},
	{"PruneMissing(present)", func(l *Ledger) (bool, error) {
		_, err := l.PruneMissing(func(string) bool { return true }, tOp)
		return false, err
	}, map[string]outcome{
		"absent": absent, "scheduled": sched, "inflight": infl, "acked": acked,
		"failed-ready": failedO, "failed-waiting": failedO, "deadletter": dead,
	}},
	{"Resend", func(l *Ledger) (bool, error) {
		_, _, err := l.Resend("s", "p", tOp)
		return false, err
	}, map[string]outcome{
		"absent": sched, "scheduled": sched, "inflight": infl, "acked": sched,
		"failed-ready": sched, "failed-waiting": sched, "deadletter": sched,
	}},
	{"RescheduleReady", func(l *Ledger) (bool, error) {
		_, err := l.RescheduleReady(tOp)
		return false, err
	}, map[string]outcome{
		"absent": absent, "scheduled": sched, "inflight": infl, "acked": acked,
		"failed-ready": sched, "failed-waiting": failedO, "deadletter": dead,
	}},
}

// TestTransitionMatrix runs every operation from every state and checks
// the resulting state, the error kind, and that a refused operation left
// the stored record byte-for-byte unchanged.
func TestTransitionMatrix(t *testing.T) {
	for _, o := range ops {
		for _, s := range starts {
			t.Run(o.name+"/"+s.name, func(t *testing.T) {
				f := newLedger(t, nil)
				s.setup(t, f.l)
				if got := stateOf(t, f.l); got != s.state {
					t.Fatalf("setup left %v, want %v", got, s.state)
				}
				before := rawRecord(t, f.db, "s", "p")
				want, ok := o.want[s.name]
				if !ok {
					t.Fatal("matrix cell missing")
				}
				claimed, err := o.run(f.l)
				switch {
				case want.err == nil && err != nil:
					t.Fatalf("unexpected error %v", err)
				case want.err != nil && !errors.Is(err, want.err):
					t.Fatalf("err = %v, want %v", err, want.err)
				}
				if errors.Is(want.err, ErrIllegalTransition) {
					var te *TransitionError
					if !errors.As(err, &te) || te.From != s.state || te.SegmentID != "s" || te.PeerID != "p" {
						t.Fatalf("err = %#v, want *TransitionError from %v", err, s.state)
					}
				}
				if claimed != want.claimed {
					t.Fatalf("claimed = %v, want %v", claimed, want.claimed)
				}
				if got := stateOf(t, f.l); got != want.state {
					t.Fatalf("state after = %v, want %v", got, want.state)
				}
				// A refused operation, and one that leaves the state as it
				// was, must not rewrite the record at all.
				if (err != nil || want.state == s.state) && !bytes.Equal(before, rawRecord(t, f.db, "s", "p")) {
					t.Fatal("record changed by a refused or no-op operation")
				}
			})
		}
	}
}

func stateOf(t *testing.T, l *Ledger) State {
	t.Helper()
	r, err := l.Get("s", "p")
	if errors.Is(err, ErrNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}
