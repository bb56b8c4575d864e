package relaycore_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// On a store that deletes loosely (DynamoDB) an alarm's clear is three
// single writes instead of one transaction (alarm.go, clearSingles): os
// marked Clearing, the alarm's guarded delete, rs and os read again. These
// tests drive the real Alarm and Enqueue into each gap between the steps.

// isClearMark: the clear's first step, os written with Clearing set.
func isClearMark(c call) bool {
	return c.Op == "apply" && len(c.Batch.Writes) == 1 && c.Batch.Writes[0].Key == relaycore.KeyOS &&
		bytes.Contains(c.Batch.Writes[0].Value, []byte(`"clr":true`))
}

// isAlarmDelete: the clear's second step.
func isAlarmDelete(c call) bool {
	return c.Op == "apply" && len(c.Batch.Writes) == 1 && c.Batch.Writes[0].Key == relaycore.KeyAlarm && c.Batch.Writes[0].Delete
}

func newClearEnv(t *testing.T) (*env, *looseStore) {
	t.Helper()
	e, ls := newLooseEnv(t, "free", relaycore.Capabilities{})
	e.enqueue(put("t", "k1", "v1"))
	return e, ls
}

// An enqueue that reads os after the mark, while the alarm is still there,
// and commits only after the whole clear (its os guard holds: the clear
// writes os only in its first step) keeps the alarm by rewriting it
// (Clearing): its put brings the alarm back for its rows. Without the
// rewrite the clear would end with the alarm gone and the rows left to the
// source's next enqueue. And it kicks: the alarm it kept is the clearing
// fire's, whose wake-up is spent; without the kick (it counted as a
// wake-up already on its way, "pending") its rows waited for the next
// enqueue past the 2 s grace, or the sweep.
func TestClearSinglesEnqueueAcrossDeleteAndReread(t *testing.T) {
	e, ls := newClearEnv(t)
	if _, err := e.h.Fire(e.ctx, e.source); err != nil { // deliver k1, leave the alarm to clear
		t.Fatal(err)
	}
	read, commit, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	enq := &faultStore{Store: e.src}
	enq.set(func(c call) error {
		if c.Op == "apply" {
			close(read) // the enqueue has read os and the alarm: let the clear go on
			<-commit
		}
		return nil
	}, nil)
	started := false
	kicker := &recordingKicker{}
	var kick relaycore.KickDecision
	e.srcF.set(func(c call) error {
		if isAlarmDelete(c) && !started {
			started = true
			go func() {
				res, err := relaycore.CommitRelayRows(e.ctx, enq, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("t", "k2", "v2")}, relaycore.EnqueueConfig{Kicker: kicker})
				kick = res.Kick
				done <- err
			}()
			<-read
		}
		return nil
	}, nil)
	alarm := &relaycore.RelayHandler{Source: ls, Target: e.tgt, Budget: e.h.Budget, Clock: e.clock}
	ar, err := alarm.Alarm(e.ctx, e.source)
	e.srcF.set(nil, nil)
	if err != nil || !ar.Cleared {
		t.Fatalf("alarm %+v, %v: want the clear to end (the enqueue has not committed yet)", ar, err)
	}
	close(commit)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	v := e.inspect(e.source)
	if len(v.Rows()) != 1 || v.Alarm == nil || v.OS.Clearing {
		t.Fatalf("%d rows, alarm %+v, os clearing %v: want the enqueue's row with an alarm, the mark reset", len(v.Rows()), v.Alarm, v.OS.Clearing)
	}
	kicker.mu.Lock()
	kicks := len(kicker.kicks)
	kicker.mu.Unlock()
	if kick != relaycore.KickSent || kicks != 1 {
		t.Errorf("enqueue kick %s, %d kicks: want it sent (the alarm it kept was being cleared)", kick, kicks)
	}
	e.drain(e.source, 5)
	if got, _ := e.target("t", "k2"); got != "v2" {
		t.Fatalf("k2 = %q at the target, want v2", got)
	}
}

// An enqueue that reads os after the mark and commits before the delete
// also rewrites the alarm, so the delete's guard fails; the clear looks
// again and keeps the alarm for its rows.
func TestClearSinglesEnqueueBetweenMarkAndDelete(t *testing.T) {
	e, _ := newClearEnv(t)
	raced := false
	e.srcF.set(func(c call) error {
		if isAlarmDelete(c) && !raced {
			raced = true
			e.enqueue(put("t", "k2", "v2")) // on the store itself, between the steps
		}
		return nil
	}, nil)
	ar, err := e.h.Alarm(e.ctx, e.source)
	e.srcF.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !raced {
		t.Fatal("the clear never came to its delete")
	}
	if ar.Cleared {
		t.Fatal("alarm reported cleared with the racing enqueue's row in the outbox")
	}
	v := e.inspect(e.source)
	if len(v.Rows()) != 1 || v.Alarm == nil {
		t.Fatalf("%d rows, alarm %+v after the race: want the racing row and an alarm for it", len(v.Rows()), v.Alarm)
	}
	e.drain(e.source, 5)
	if got, _ := e.target("t", "k2"); got != "v2" {
		t.Fatalf("k2 = %q at the target, want v2", got)
	}
}

// A clear that stops after its mark (the delete refused, the process gone)
// leaves os saying Clearing and the alarm in place; the next enqueue keeps
// the alarm by rewriting it and resets the mark, and the source drains.
func TestClearSinglesStoppedAfterMark(t *testing.T) {
	e, _ := newClearEnv(t)
	e.srcF.set(func(c call) error {
		if isAlarmDelete(c) {
			return fmt.Errorf("injected: %w", relaycore.ErrUnavailable)
		}
		return nil
	}, nil)
	if _, err := e.h.Alarm(e.ctx, e.source); err == nil {
		t.Fatal("alarm succeeded with its delete refused")
	}
	e.srcF.set(nil, nil)
	v := e.inspect(e.source)
	if !v.OS.Clearing || v.Alarm == nil {
		t.Fatalf("os clearing %v, alarm %+v: want the mark left and the alarm in place", v.OS.Clearing, v.Alarm)
	}
	before, _, _ := e.src.Get(e.ctx, e.source, relaycore.KeyAlarm)
	e.enqueue(put("t", "k2", "v2"))
	after, _, _ := e.src.Get(e.ctx, e.source, relaycore.KeyAlarm)
	if bytes.Equal(before, after) {
		t.Fatalf("alarm %s unchanged by an enqueue while os says Clearing", after)
	}
	if v := e.inspect(e.source); v.OS.Clearing || v.Alarm == nil || v.Alarm.DueMS > e.clock.Now().UnixMilli() {
		t.Fatalf("os clearing %v, alarm %+v: want the mark reset and the alarm due", v.OS.Clearing, v.Alarm)
	}
	e.drain(e.source, 5)
	if got, _ := e.target("t", "k2"); got != "v2" {
		t.Fatalf("k2 = %q at the target, want v2", got)
	}
}

// A retry marker put right after the delete (with its rs write, as every
// writer of a marker does) is seen by the step that checks rs: the guarded
// rewrite of rs when it lists pages deleted loosely (the alarm's fire
// delivered), else the re-read (the fire found nothing: its claim cleared
// the list). The alarm is armed again at the marker's due time. A marker
// put after that check is its writer's to wake: a fire's alarm re-arms when
// it ends, an operator action writes the alarm.
func TestClearSinglesMarkerAfterDelete(t *testing.T) {
	for _, delivered := range []bool{true, false} {
		t.Run(fmt.Sprintf("delivered=%v", delivered), func(t *testing.T) {
			e, _ := newClearEnv(t)
			if !delivered {
				if _, err := e.h.Fire(e.ctx, e.source); err != nil {
					t.Fatal(err)
				}
			}
			due := e.clock.Now().Add(time.Minute).UnixMilli()
			deleted, checkedBy := false, ""
			e.srcF.set(func(c call) error {
				if isAlarmDelete(c) {
					deleted = true
					return nil
				}
				if !deleted {
					return nil
				}
				deleted, checkedBy = false, c.Op
				raw, _, err := e.src.Get(e.ctx, e.source, relaycore.KeyRS)
				if err != nil {
					return err
				}
				var rs map[string]any
				if err := json.Unmarshal(raw, &rs); err != nil {
					return err
				}
				rs["ver"] = rs["ver"].(float64) + 1
				next, _ := json.Marshal(rs)
				marker := fmt.Sprintf("v/%016x/%x", due, "t")
				return e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: next}, {Key: marker, Value: []byte("1")}}})
			}, nil)
			ar, err := e.h.Alarm(e.ctx, e.source)
			e.srcF.set(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: "apply", false: "getmany"}[delivered]; checkedBy != want {
				t.Fatalf("the step after the delete was %q, want %q", checkedBy, want)
			}
			if ar.Cleared {
				t.Fatal("alarm reported cleared with a retry marker put before its check of rs")
			}
			if v := e.inspect(e.source); v.Alarm == nil || v.Alarm.DueMS != due {
				t.Fatalf("alarm %+v, want it re-armed at the marker's due time %d", v.Alarm, due)
			}
		})
	}
}

// On a store that is not a LooseDeleter the clear stays one transaction
// and os never says Clearing.
func TestClearTransactionalElsewhere(t *testing.T) {
	e := newEnv(t, "free")
	e.src = mem.New(relaycore.Capabilities{})
	e.srcF.Store = e.src
	e.enqueue(put("t", "k1", "v1"))
	clears := 0
	e.srcF.set(func(c call) error {
		if isClearMark(c) {
			t.Error("a transactional store's clear marked os Clearing")
		}
		if c.Op == "apply" {
			for _, w := range c.Batch.Writes {
				if w.Key == relaycore.KeyAlarm && w.Delete && len(c.Batch.Preconditions) >= 3 {
					clears++
				}
			}
		}
		return nil
	}, nil)
	ar, err := e.h.Alarm(e.ctx, e.source)
	e.srcF.set(nil, nil)
	if err != nil || !ar.Cleared || clears != 1 {
		t.Fatalf("alarm %+v, %v, %d guarded clears: want one transactional clear", ar, err, clears)
	}
}
