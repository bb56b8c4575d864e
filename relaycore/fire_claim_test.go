package relaycore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// A fire that finds another fire's live claim on the source steps aside
// (Busy) without reading a target or spending budget; once a crashed fire's
// claim has lapsed (ClaimTTL), the next fire takes over.
func TestFireStepsAsideForLiveClaim(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "v"))

	// An overlapping fire, started while the first delivers.
	var overlap relaycore.FireResult
	started := false
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && !started {
			started = true
			var err error
			if overlap, err = e.h.Fire(e.ctx, e.source); err != nil {
				t.Fatalf("overlapping fire: %v", err)
			}
		}
		return nil
	}, nil)
	res, err := e.h.Fire(e.ctx, e.source)
	e.tgtF.set(nil, nil)
	if err != nil || res.Busy || res.RowsDelivered != 1 {
		t.Fatalf("first fire: %+v, %v", res, err)
	}
	if !overlap.Busy || overlap.TargetReads != 0 || overlap.TargetCalls != 0 || overlap.RowsInspected != 0 {
		t.Fatalf("overlapping fire did not step aside: %+v", overlap)
	}

	// A fire that dies before its checkpoint leaves its claim: here every
	// write of rs after the claim's fails, the checkpoint and the release
	// of the claim on the way out alike, as if the process had died.
	e.enqueue(put("t", "k", "w"))
	claimed := false
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && c.Batch.Writes[0].Key == relaycore.KeyRS {
			if !claimed {
				claimed = true
				return nil
			}
			return errInjected // surely not applied
		}
		return nil
	}, nil)
	if _, err := e.h.Fire(e.ctx, e.source); !errors.Is(err, errInjected) {
		t.Fatalf("fire with a failing checkpoint: %v", err)
	}
	e.srcF.set(nil, nil)
	e.clock.Advance(e.h.ClaimTTLOrDefault() - time.Millisecond)
	if res, err := e.h.Fire(e.ctx, e.source); err != nil || !res.Busy || res.TargetReads != 0 {
		t.Fatalf("fire within the dead fire's claim: %+v, %v", res, err)
	}
	e.clock.Advance(time.Millisecond)
	if res, err := e.h.Fire(e.ctx, e.source); err != nil || res.Busy || res.RowsCleaned != 1 {
		t.Fatalf("fire after the claim lapsed: %+v, %v", res, err)
	}
	if v, _ := e.target("t", "k"); v != "w" {
		t.Fatalf("target k = %q, want w", v)
	}
}

// A fire or an alarm for a source nothing was ever enqueued to (a
// mistyped schedule, a stray event) writes nothing: no rs claim is left
// behind to grow the table by one item per name tried. Once rows are
// enqueued, the next fire delivers them as usual.
func TestFireOfUnknownSourceWritesNothing(t *testing.T) {
	e := newEnv(t, "free")
	applies := 0
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			applies++
		}
		return nil
	}, nil)
	if res, err := e.h.Fire(e.ctx, "never-written"); err != nil || res.Busy || res.Progress || res.More {
		t.Fatalf("fire of an unknown source: %+v, %v", res, err)
	}
	if ar, err := e.h.Alarm(e.ctx, "never-written"); err != nil || !ar.Cleared || ar.Busy || ar.Fires > 1 {
		t.Fatalf("alarm of an unknown source: %+v, %v", ar, err)
	}
	if applies != 0 {
		t.Fatalf("%d batches written for a source nobody wrote to", applies)
	}
	if page, err := e.src.Scan(e.ctx, "never-written", relaycore.ScanRequest{}); err != nil || len(page.Items) != 0 {
		t.Fatalf("items of the unknown source: %+v, %v", page.Items, err)
	}
	e.srcF.set(nil, nil)
	e.enqueueFrom("never-written", put("t", "k", "v"))
	if res, err := e.h.Fire(e.ctx, "never-written"); err != nil || res.RowsDelivered != 1 {
		t.Fatalf("first fire after an enqueue: %+v, %v", res, err)
	}
	if v, ok := e.target("t", "k"); !ok || v != "v" {
		t.Fatalf("target t/k = %q, %v after delivery", v, ok)
	}
}
