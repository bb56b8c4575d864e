package relaycore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// countSourceApplies counts Apply calls to the source store from now on.
func (e *env) countSourceApplies() *int {
	var n int
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			n++
		}
		return nil
	}, nil)
	return &n
}

// A manual quarantine or pause moves the target's rows still in the outbox
// aside at once: its status shows them held and a skip right after it (no
// fire in between) finds them. Before, held was 0 until the next fire, and
// the skip failed with "no held rows".
func TestQuarantineHoldsOutboxRowsAtOnce(t *testing.T) {
	for _, action := range []string{"quarantine", "pause"} {
		t.Run(action, func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(put("t", "k", "poison"), put("u", "k", "1"))
			e.enqueue(put("t", "k", "2"), put("t", "j", "2"))
			a := relaycore.Actor{By: "op", Reason: "poison"}
			var err error
			if action == "quarantine" {
				_, err = e.h.Quarantine(e.ctx, e.source, "t", a)
			} else {
				_, err = e.h.Pause(e.ctx, e.source, "t", a)
			}
			if err != nil {
				t.Fatal(err)
			}
			s := status(t, e, "t")
			if s.Held != 3 || s.HeldFirst != 1 || s.HeldLast != 4 || s.Pending != 3 {
				t.Fatalf("right after the %s: %+v", action, s)
			}
			v := e.inspect(e.source)
			if len(v.Held) != 2 || len(v.Pages) != 1 || v.Hold.HeldRows != 3 || v.Hold.HeldTargets != 1 {
				t.Fatalf("held pages %d, outbox pages %d, q %+v", len(v.Held), len(v.Pages), v.Hold)
			}
			res, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 1, Actor: a})
			if err != nil || res.Rows != 1 {
				t.Fatalf("skip right after the %s: %+v, %v", action, res, err)
			}
			if action == "quarantine" {
				_, err = e.h.Release(e.ctx, e.source, "t", a)
			} else {
				_, err = e.h.Resume(e.ctx, e.source, "t", a)
			}
			if err != nil {
				t.Fatal(err)
			}
			e.drain(e.source, 20)
			if got, _ := e.target("t", "k"); got != "2" {
				t.Fatalf("t/k = %q, want 2", got)
			}
			if got, _ := e.target("u", "k"); got != "1" {
				t.Fatalf("u/k = %q, want 1", got)
			}
			if s := status(t, e, "t"); s.Pending != 0 || s.Held != 0 || s.Skipped != 1 || s.Done != 3 {
				t.Fatalf("after the drain: %+v", s)
			}
		})
	}
}

// The quarantine finds the target's pages through the runs its enqueue
// counters keep (the latest 3 batches when folded into os, as here; 8 in a
// t/<hex>/e record). When older runs were dropped it
// moves them only if the pages it found account for every row the target
// still has in the outbox, so held rows never get newer than an outbox row;
// otherwise the fires move them, in order, as before.
func TestQuarantineHoldsOnlyAPrefix(t *testing.T) {
	for _, tc := range []struct {
		name      string
		delivered int // batches delivered before the rest were enqueued
		wantHeld  uint64
	}{
		{"older runs delivered", 7, 3},
		{"older runs in the outbox", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			for i := 0; i < tc.delivered; i++ {
				e.enqueue(put("t", "k", fmt.Sprint("old", i)))
			}
			e.drain(e.source, 20)
			for i := 0; i < 10-tc.delivered; i++ {
				e.enqueue(put("t", "k", fmt.Sprint(i)), put("u", fmt.Sprint("k", i), "x"))
			}
			if _, err := e.h.Quarantine(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
				t.Fatal(err)
			}
			if s := status(t, e, "t"); s.Held != tc.wantHeld {
				t.Fatalf("held %d right after the quarantine, want %d: %+v", s.Held, tc.wantHeld, s)
			}
			e.drain(e.source, 20)
			if s := status(t, e, "t"); s.Held != uint64(10-tc.delivered) || s.HeldFirst != uint64(tc.delivered+1) {
				t.Fatalf("after the fires: %+v", s)
			}
		})
	}
}

// A skip whose range lies below the target's first held seq is refused
// from the target record without taking the source's claim: no store write
// at all (it wrote rs twice to answer 409 before). The answer still names
// the first undelivered held seq.
func TestSkipBelowFirstHeldWritesNothing(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("u", "k", "1"), put("t", "k", "2"), put("t", "k", "3"))
	if _, err := e.h.Quarantine(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	if s := status(t, e, "t"); s.Held != 2 || s.HeldFirst != 2 {
		t.Fatalf("status %+v", s)
	}
	applies := e.countSourceApplies()
	_, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{Reason: "stale"}})
	var ce *relaycore.SkipConflictError
	if !errors.As(err, &ce) || ce.Actual != 2 {
		t.Fatalf("skip below the first held seq: %v, want a conflict naming seq 2", err)
	}
	if *applies != 0 {
		t.Fatalf("the refused skip made %d source writes, want 0", *applies)
	}
	if _, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 2, Through: 2, Actor: relaycore.Actor{Reason: "ok"}}); err != nil {
		t.Fatalf("the corrected skip: %v", err)
	}
}
