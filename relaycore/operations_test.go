package relaycore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// alarmOnce runs the source's due alarm (advancing the clock to it) and
// returns its result; ok false when the source has no alarm.
func (e *env) alarmOnce() (relaycore.AlarmResult, bool) {
	e.t.Helper()
	raw, found, err := e.src.Get(e.ctx, e.source, relaycore.KeyAlarm)
	if err != nil {
		e.t.Fatal(err)
	}
	if !found {
		return relaycore.AlarmResult{}, false
	}
	var a relaycore.AlarmRecord
	if err := json.Unmarshal(raw, &a); err != nil {
		e.t.Fatal(err)
	}
	e.clock.Set(timeMS(a.DueMS))
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		e.t.Fatalf("alarm: %v", err)
	}
	return ar, true
}

// heldBound is the bound docs/engine.md states for a healthy target behind
// n permanently failing targets (one row each, ahead of it in seq order):
// the blocked set fills at one fire per alarm (fires with only new failures
// make no progress), then every fire moves at least TargetsPerFire −
// redrive share failing targets aside, FiresPerAlarm fires an alarm; one
// more alarm delivers the healthy row.
func heldBound(b relaycore.RelayBudget, n int) int {
	share := max(1, b.TargetsPerFire/2)
	fill := (relaycore.MaxBlockedTargets + b.TargetsPerFire - 1) / b.TargetsPerFire
	perAlarm := (b.TargetsPerFire - share) * b.FiresPerAlarm
	return fill + (n-relaycore.MaxBlockedTargets+perAlarm-1)/perAlarm + 1
}

// The goal: 1,000 permanently failing targets ahead of a healthy
// one, Free plan. Before quarantine existed the healthy row was never
// delivered (every cycle reset at the 33rd failure).
func TestThousandFailingTargetsDoNotStallHealthy(t *testing.T) {
	e := newEnv(t, "free")
	e.h.QuarantineAfter = 3
	failing := true
	e.failTargets("bad", &failing)
	var rows []relaycore.Row
	const n = 1000
	for i := 0; i < n; i++ {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("bad%04d", i)), "k", "v"))
	}
	rows = append(rows, put("healthy", "k", "v1"))
	e.enqueue(rows...)
	b := e.h.Budget
	bound := heldBound(b, n)
	alarms := 0
	for ; ; alarms++ {
		if v, ok := e.target("healthy", "k"); ok && v == "v1" {
			break
		}
		if alarms >= bound {
			t.Fatalf("healthy row not delivered within %d alarms", bound)
		}
		ar, ok := e.alarmOnce()
		if !ok {
			t.Fatal("alarm record gone before delivery")
		}
		if ar.TargetCalls > b.TargetCallsPerAlarm() {
			t.Fatalf("alarm %d made %d target calls, cap %d", alarms, ar.TargetCalls, b.TargetCallsPerAlarm())
		}
		if alarms%8 == 0 {
			checkBlockedInvariant(t, e.inspect(e.source))
		}
	}
	t.Logf("healthy row delivered after %d alarms behind %d failing targets (bound %d)", alarms, n, bound)

	// Keep going until every failing target is quarantined: then nothing
	// is left for an alarm to do (the alarm record is cleared), and they
	// cost a healthy target's fires nothing.
	for i := 0; ; i++ {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
		if i > 20000 {
			t.Fatalf("not all quarantined: q %+v", e.inspect(e.source).Hold)
		}
	}
	v := e.inspect(e.source)
	if v.Hold.Quarantined != n || len(v.Retries) != 0 || len(v.RS.Blocked) != 0 || v.Hold.HeldRows != n || len(v.Pages) != 0 {
		t.Fatalf("alarm cleared but q %+v, markers %d, blocked %d, outbox pages %d", v.Hold, len(v.Retries), len(v.RS.Blocked), len(v.Pages))
	}
	for round := 0; round < 3; round++ {
		e.clock.Advance(time.Second)
		e.enqueue(put("healthy", "k", fmt.Sprint("v", round+2)))
		ar, _ := e.alarmOnce()
		if ar.RowsDelivered != 1 || ar.TargetCalls != 1 || ar.RowsInspected != 1 || ar.TargetsRedriven != 0 {
			t.Fatalf("healthy row beside %d quarantined targets: %+v", n, ar)
		}
		if _, ok := e.alarmOnce(); ok {
			t.Fatal("alarm not cleared after the healthy row")
		}
	}
}

func status(t *testing.T, e *env, target relaycore.Partition) relaycore.TargetStatus {
	t.Helper()
	s, err := relaycore.GetTarget(e.ctx, e.src, e.source, target)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A target that keeps failing is quarantined after QuarantineAfter rounds;
// its rows, old and new, are held in order and cost nothing; release
// redrives them oldest first before any newer row.
func TestQuarantineHoldsAndReleaseRedrivesInOrder(t *testing.T) {
	e := newEnv(t, "free")
	e.h.QuarantineAfter = 3
	failing := true
	e.failTargets("bad", &failing)
	e.enqueue(put("bad", "k", "1"), put("bad", "k", "2"), put("ok", "k", "1"))
	for i := 0; i < 50 && status(t, e, "bad").State != relaycore.StateQuarantined; i++ {
		e.alarmOnce()
	}
	s := status(t, e, "bad")
	if s.State != relaycore.StateQuarantined || s.Held != 2 || s.Pending != 2 || s.FirstSeq != 1 || s.LastError == nil || s.LastError.Class != relaycore.ErrorClassApply {
		t.Fatalf("status %+v", s)
	}
	if s.Note == nil || s.Note.Action != "quarantine" || s.Note.Reason != "3 failed rounds in a row" {
		t.Fatalf("automatic quarantine note %+v", s.Note)
	}
	// New rows for it are held too, and cost no calls.
	e.enqueue(put("bad", "k", "3"), put("ok", "k", "2"))
	applies := e.countTargetApplies()
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	if *applies != 1 {
		t.Fatalf("%d target applies, want 1 (ok's row only)", *applies)
	}
	if s := status(t, e, "bad"); s.Held != 3 || s.HeldFirst != 1 || s.HeldLast != 4 {
		t.Fatalf("after new row: %+v", s)
	}
	// Release while it still fails: back to quarantine at once.
	if _, err := e.h.Release(e.ctx, e.source, "bad", relaycore.Actor{By: "op", Reason: "try"}); err != nil {
		t.Fatal(err)
	}
	e.failTargets("bad", &failing)
	e.alarmOnce()
	if s := status(t, e, "bad"); s.State != relaycore.StateQuarantined || s.Held != 3 {
		t.Fatalf("failed redrive: %+v", s)
	}
	// Release after the fix: rows arrive oldest first, then a newer row.
	failing = false
	var order []string
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "bad" {
			for _, w := range c.Batch.Writes {
				if w.Key == "k" {
					order = append(order, string(w.Value))
				}
			}
		}
		return nil
	}, nil)
	if _, err := e.h.Release(e.ctx, e.source, "bad", relaycore.Actor{By: "op", Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	e.enqueue(put("bad", "k", "4"))
	for i := 0; ; i++ {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
		if i > 20 {
			t.Fatal("not drained")
		}
	}
	if got, _ := e.target("bad", "k"); got != "4" {
		t.Fatalf("bad/k = %q, want 4", got)
	}
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("applied out of order: %v", order)
		}
	}
	s = status(t, e, "bad")
	if s.State != relaycore.StateActive || s.Pending != 0 || s.Held != 0 || s.Done != 4 || s.Released {
		t.Fatalf("after redrive: %+v", s)
	}
	v := e.inspect(e.source)
	if len(v.Held) != 0 || len(v.Retries) != 0 || v.Hold != (relaycore.HoldSummary{Version: v.Hold.Version}) {
		t.Fatalf("leftovers: held %d markers %d q %+v", len(v.Held), len(v.Retries), v.Hold)
	}
}

// Skip archives a poison row atomically, checks the expected first seq,
// refuses bad requests without writing, and the archive can be requeued.
func TestSkipArchivesPoisonRow(t *testing.T) {
	e := newEnv(t, "free")
	poison := true
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "t" && poison {
			for _, w := range c.Batch.Writes {
				if string(w.Value) == "poison" {
					return errInjected
				}
			}
		}
		return nil
	}, nil)
	e.enqueue(put("t", "p", "poison"), put("t", "g", "good"))
	e.alarmOnce()
	if _, err := e.h.Quarantine(e.ctx, e.source, "t", relaycore.Actor{By: "op", Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	s := status(t, e, "t")
	if s.Held != 2 || s.FirstSeq != 1 {
		t.Fatalf("before skip: %+v", s)
	}
	before := e.inspect(e.source)
	bad := []relaycore.SkipRequest{
		{Target: "nope", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{Reason: "x"}},
		{Target: "t", ExpectFirst: 2, Through: 2, Actor: relaycore.Actor{Reason: "stale"}},
		{Target: "t", ExpectFirst: 1, Through: 9, Actor: relaycore.Actor{Reason: "past"}},
		{Target: "t", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{Reason: string(make([]byte, relaycore.MaxReasonLen+1))}},
		{Target: "t", ExpectFirst: 1, Through: 1},
	}
	wants := []error{relaycore.ErrUnknownTarget, relaycore.ErrSkipConflict, relaycore.ErrSkipRange, relaycore.ErrInvalidOperatorInput, relaycore.ErrInvalidOperatorInput}
	for i, req := range bad {
		if _, err := e.h.Skip(e.ctx, e.source, req); !errors.Is(err, wants[i]) {
			t.Fatalf("bad skip %d: %v, want %v", i, err, wants[i])
		}
	}
	after := e.inspect(e.source)
	if len(after.Held) != len(before.Held) || len(after.Archive) != 0 || after.Hold != before.Hold {
		t.Fatal("a refused skip wrote something")
	}
	res, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{By: "op", Reason: "poison row"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 1 || res.ArchiveID != 1 || res.Status.Held != 1 || res.Status.FirstSeq != 2 || res.Status.Skipped != 1 {
		t.Fatalf("skip result %+v", res)
	}
	if _, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{By: "op", Reason: "rest"}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	if got, _ := e.target("t", "g"); got != "good" {
		t.Fatalf("t/g = %q, want good", got)
	}
	if _, ok := e.target("t", "p"); ok {
		t.Fatal("the skipped poison row was applied")
	}
	arch, _, err := relaycore.ListArchive(e.ctx, e.src, e.source, 0, 10)
	if err != nil || len(arch) != 1 || len(arch[0].Rows) != 1 || string(arch[0].Rows[0].Puts[0].Value) != "poison" || arch[0].Reason != "poison row" || arch[0].LastError == nil {
		t.Fatalf("archive %+v, %v", arch, err)
	}
	if s := status(t, e, "t"); s.Pending != 0 || s.Done != 2 || s.Skipped != 1 {
		t.Fatalf("after: %+v", s)
	}
	// Requeue once (the fix is in): applied; a second requeue returns the
	// same seqs and commits nothing.
	poison = false
	seqs, err := relaycore.Requeue(e.ctx, e.src, e.clock, e.source, 1, relaycore.EnqueueConfig{})
	if err != nil || len(seqs) != 1 {
		t.Fatalf("requeue: %v %v", seqs, err)
	}
	again, err := relaycore.Requeue(e.ctx, e.src, e.clock, e.source, 1, relaycore.EnqueueConfig{})
	if err != nil || fmt.Sprint(again) != fmt.Sprint(seqs) {
		t.Fatalf("second requeue: %v %v", again, err)
	}
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	if got, _ := e.target("t", "p"); got != "poison" {
		t.Fatalf("t/p = %q after requeue", got)
	}
}

// Pause holds without counting failures; resume delivers in order. Actions
// in the wrong state are refused.
func TestPauseResume(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "1"))
	if _, err := e.h.Pause(e.ctx, e.source, "t", relaycore.Actor{By: "op", Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Pause(e.ctx, e.source, "t", relaycore.Actor{}); !errors.Is(err, relaycore.ErrWrongState) {
		t.Fatalf("pause twice: %v", err)
	}
	if _, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{}); !errors.Is(err, relaycore.ErrWrongState) {
		t.Fatalf("release a paused target: %v", err)
	}
	applies := e.countTargetApplies()
	e.enqueue(put("t", "k", "2"))
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	if *applies != 0 {
		t.Fatalf("%d applies to a paused target", *applies)
	}
	s := status(t, e, "t")
	if s.State != relaycore.StatePaused || s.Held != 2 || s.FailedRounds != 0 {
		t.Fatalf("paused: %+v", s)
	}
	if _, err := e.h.Resume(e.ctx, e.source, "t", relaycore.Actor{By: "op"}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := e.alarmOnce(); !ok {
			break
		}
	}
	if got, _ := e.target("t", "k"); got != "2" || *applies != 1 {
		t.Fatalf("t/k = %q after resume, %d applies", got, *applies)
	}
}

// An operator action waits for no one: a live fire claim makes it fail
// with ErrSourceBusy and write nothing.
func TestOperatorActionBusy(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "1"))
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" {
			if _, err := e.h.Pause(e.ctx, e.source, "t", relaycore.Actor{}); !errors.Is(err, relaycore.ErrSourceBusy) {
				t.Errorf("pause during a fire: %v", err)
			}
		}
		return nil
	}, nil)
	e.alarmOnce()
	if s := status(t, e, "t"); s.State != relaycore.StateActive || s.Pending != 0 {
		t.Fatalf("%+v", s)
	}
}
