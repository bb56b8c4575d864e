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
