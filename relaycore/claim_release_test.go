package relaycore_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// rsClaim returns the claim rs holds (nil: none).
func (e *env) rsClaim() *relaycore.Claim {
	e.t.Helper()
	raw, found, err := e.src.Get(e.ctx, e.source, relaycore.KeyRS)
	if err != nil || !found {
		e.t.Fatalf("read rs: found %v, %v", found, err)
	}
	var rs relaycore.RelayState
	if err := json.Unmarshal(raw, &rs); err != nil {
		e.t.Fatal(err)
	}
	return rs.Claim
}

// A fire that fails on a store error after taking the claim gives the claim
// back on its way out: the next fire and an operator action at the same
// instant find the source free (before, both were refused for ClaimTTL).
func TestFailedFireReleasesItsClaim(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(c call) bool
	}{
		// One read whose retries ran out: the scan of the outbox.
		{"scan", func(c call) bool { return c.Op == "scan" && c.Key == layout.PagePrefix }},
		// The checkpoint, surely not applied.
		{"checkpoint", func(c call) bool {
			return c.Op == "apply" && len(c.Batch.Writes) > 1 && c.Batch.Writes[0].Key == relaycore.KeyRS
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(put("t", "k", "v"))
			e.srcF.set(func(c call) error {
				if tc.fail(c) {
					return errInjected
				}
				return nil
			}, nil)
			if _, err := e.h.Alarm(e.ctx, e.source); !errors.Is(err, errInjected) {
				t.Fatalf("alarm with a failing %s: %v", tc.name, err)
			}
			e.srcF.set(nil, nil)
			if c := e.rsClaim(); c != nil {
				t.Fatalf("the failed fire left its claim %+v", c)
			}
			if _, err := e.h.Pause(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
				t.Fatalf("pause right after the failed fire: %v", err)
			}
			if _, err := e.h.Resume(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
				t.Fatalf("resume: %v", err)
			}
			res, err := e.h.Fire(e.ctx, e.source)
			if err != nil || res.Busy || res.RowsCleaned != 1 {
				t.Fatalf("fire right after the failed one: %+v, %v", res, err)
			}
		})
	}
}

// A claim write whose outcome is unknown every time and that never lands
// (a store whose commits fail: a full disk) fails the alarm, so the host
// counts a failed alarm and logs it; it was reported busy, which hosts
// take for another fire at work, so nothing said the source was stuck.
func TestClaimThatNeverLandsFailsTheAlarm(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "v"))
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && len(c.Batch.Writes) == 1 && c.Batch.Writes[0].Key == relaycore.KeyRS {
			return relaycore.ErrMaybeApplied
		}
		return nil
	}, nil)
	res, err := e.h.Alarm(e.ctx, e.source)
	if !errors.Is(err, relaycore.ErrMaybeApplied) || res.Busy {
		t.Fatalf("alarm whose claim never lands: %+v, %v; want the store's error, not busy", res, err)
	}
	e.srcF.set(nil, nil)
	if res, err := e.h.Alarm(e.ctx, e.source); err != nil || res.RowsDelivered != 1 {
		t.Fatalf("alarm once commits land: %+v, %v", res, err)
	}
}

// The release is guarded: a fire whose claim lapsed and was taken over
// meanwhile fails without touching the new holder's claim.
func TestFailedFireKeepsAnotherFiresClaim(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "v"))
	other := relaycore.Claim{Owner: "other", UntilMS: e.clock.Now().Add(time.Hour).UnixMilli()}
	e.tgtF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		// Mid-fire, another fire takes the source over.
		raw, _, err := e.src.Get(e.ctx, e.source, relaycore.KeyRS)
		if err != nil {
			t.Fatal(err)
		}
		var rs relaycore.RelayState
		if err := json.Unmarshal(raw, &rs); err != nil {
			t.Fatal(err)
		}
		rs.Version++
		rs.Claim = &other
		next, _ := json.Marshal(rs)
		if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: next}}}); err != nil {
			t.Fatal(err)
		}
		return nil
	}, nil)
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && len(c.Batch.Writes) > 1 && c.Batch.Writes[0].Key == relaycore.KeyRS {
			return errInjected
		}
		return nil
	}, nil)
	if _, err := e.h.Fire(e.ctx, e.source); !errors.Is(err, errInjected) {
		t.Fatalf("fire: %v", err)
	}
	if c := e.rsClaim(); c == nil || *c != other {
		t.Fatalf("rs claim %+v, want the other fire's %+v", c, other)
	}
}

// An alarm that meets a live claim asks the Kicker to wake the source when
// that claim lapses (a fire that died cannot re-arm its alarm), or in a
// moment when it is an operator action's.
func TestBusyAlarmKicksAtClaimExpiry(t *testing.T) {
	e := newEnv(t, "free")
	k := &recordingKicker{}
	e.h.Kicker = k
	e.enqueue(put("t", "k", "v"))
	// A fire dies after taking its claim (every later rs write fails).
	claimed := false
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && c.Batch.Writes[0].Key == relaycore.KeyRS {
			if !claimed {
				claimed = true
				return nil
			}
			return errInjected
		}
		return nil
	}, nil)
	if _, err := e.h.Fire(e.ctx, e.source); !errors.Is(err, errInjected) {
		t.Fatalf("dying fire: %v", err)
	}
	e.srcF.set(nil, nil)
	until := e.rsClaim().UntilMS
	e.clock.Advance(time.Second)
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil || !ar.Busy || ar.BusyRetryMS != until {
		t.Fatalf("alarm behind the dead claim: %+v, %v (claim until %d)", ar, err, until)
	}
	if len(k.kicks) != 1 || k.kicks[0] != until {
		t.Fatalf("kicks %v, want one at the claim's expiry %d", k.kicks, until)
	}
	e.clock.Set(time.UnixMilli(until))
	if ar, err := e.h.Alarm(e.ctx, e.source); err != nil || ar.Busy || ar.RowsCleaned != 1 {
		t.Fatalf("alarm at the claim's expiry: %+v, %v", ar, err)
	}

	// An operator action's claim: retried after a second, not its ttl.
	e.enqueue(put("t", "k", "w"))
	k.kicks = nil
	var during relaycore.AlarmResult
	e.srcF.set(func(c call) error {
		if c.Op == "scan" && c.Key == layout.TargetPrefix+"74/" && during.Fires == 0 {
			if during, err = e.h.Alarm(e.ctx, e.source); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	}, nil)
	if _, err := e.h.Pause(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	e.srcF.set(nil, nil)
	want := e.clock.Now().Add(time.Second).UnixMilli()
	if !during.Busy || during.BusyRetryMS != want || len(k.kicks) != 1 || k.kicks[0] != want {
		t.Fatalf("alarm during an operator action: %+v, kicks %v, want a retry at %d", during, k.kicks, want)
	}
}

// An operator action whose commit loses its own precondition to a
// concurrent enqueue (the producer re-armed the alarm the action guarded)
// reads again under its claim and commits; one that keeps losing fails with
// ErrContention and gives its claim back.
func TestOperatorActionRetriesLostPrecondition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		losses int
	}{{"once", 1}, {"always", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.QuarantineAfter = 1
			failing := true
			e.failTargets("t", &failing)
			e.enqueue(put("t", "k", "1"))
			for status(t, e, "t").State != relaycore.StateQuarantined {
				if _, ok := e.alarmOnce(); !ok {
					t.Fatal("alarm gone before the quarantine")
				}
			}
			for {
				if _, ok := e.alarmOnce(); !ok {
					break // drained: the alarm record is gone
				}
			}
			failing = false
			losses := 0
			e.srcF.set(func(c call) error {
				if c.Op == "apply" && c.Batch.Writes[0].Key == relaycore.KeyRS && len(c.Batch.Writes) > 1 && losses < tc.losses {
					// The action's commit: a producer gets in first.
					losses++
					if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Delete: true}}}); err != nil {
						t.Fatal(err)
					}
					e.clock.Advance(time.Millisecond)
					e.enqueue(put("other", "k", "x"))
				}
				return nil
			}, nil)
			_, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{By: "op"})
			e.srcF.set(nil, nil)
			if tc.losses == 1 {
				if err != nil || losses != 1 {
					t.Fatalf("release that lost one race: %v (%d losses)", err, losses)
				}
				if s := status(t, e, "t"); s.State != relaycore.StateActive {
					t.Fatalf("after release: %+v", s)
				}
			} else if !errors.Is(err, relaycore.ErrContention) || losses != 4 {
				t.Fatalf("release that always loses: %v after %d losses, want ErrContention after 4", err, losses)
			}
			if c := e.rsClaim(); c != nil {
				t.Fatalf("the action left its claim %+v", c)
			}
			if res, err := e.h.Fire(e.ctx, e.source); err != nil || res.Busy {
				t.Fatalf("fire right after the action: %+v, %v", res, err)
			}
		})
	}
}
