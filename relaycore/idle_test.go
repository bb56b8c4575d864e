package relaycore_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// idleItems counts the source's storage that belongs to target: its t/
// records and its entries in os and rs.
func idleItems(t *testing.T, e *env, target relaycore.Partition) int {
	t.Helper()
	th := hex.EncodeToString([]byte(target))
	n := 0
	pg, err := e.src.Scan(e.ctx, e.source, relaycore.ScanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range pg.Items {
		if strings.HasPrefix(it.Key, "t/"+th+"/") {
			n++
		}
		if (it.Key == relaycore.KeyOS || it.Key == relaycore.KeyRS) && strings.Contains(string(it.Value), `"t":"`+th+`"`) {
			n++
		}
	}
	return n
}

// isSweep reports whether c is an idle-collection batch: the only one that
// moves rs.swept_ms on from a value already set (a source's first
// checkpoint sets it from 0). It does not look at the batch's guards, so a
// sweep that lost one is still found.
func isSweep(c call) bool {
	if c.Op != "apply" || len(c.Batch.Preconditions) == 0 || len(c.Batch.Writes) == 0 ||
		c.Batch.Preconditions[0].Key != relaycore.KeyRS || c.Batch.Writes[0].Key != relaycore.KeyRS {
		return false
	}
	var was, now struct {
		SweptMS int64 `json:"swept_ms"`
	}
	if json.Unmarshal(c.Batch.Preconditions[0].Value, &was) != nil || json.Unmarshal(c.Batch.Writes[0].Value, &now) != nil {
		return false
	}
	return was.SweptMS != 0 && now.SweptMS != was.SweptMS
}

// A source relays to 40 targets (32 folded into os and rs, 8 with their
// own records), one of them quarantined with held rows, one paused, one
// failing; after IdleTargetTTL without activity an alarm collects the
// healthy idle ones: nothing of them is left, the listing shows the rest,
// and a collected target comes back from zero, exactly.
func TestIdleTargetsCollected(t *testing.T) {
	e := newEnv(t, "paid")
	e.h.IdleTargetTTL = time.Hour
	e.h.QuarantineAfter = 100
	failing := true
	e.failTargets("fail", &failing)
	var rows []relaycore.Row
	for i := range 40 {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("idle%02d", i)), "k", fmt.Sprint(i)))
	}
	rows = append(rows, put("quar", "k", "q"), put("paused", "k", "p"), put("fail", "k", "f"))
	e.enqueue(rows...)
	for range 5 {
		e.alarmOnce() // fail stays blocked: no drain
	}
	who := relaycore.Actor{By: "op", Reason: "test"}
	if _, err := e.h.Pause(e.ctx, e.source, "paused", who); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Quarantine(e.ctx, e.source, "quar", who); err != nil {
		t.Fatal(err)
	}
	e.enqueue(put("quar", "k", "q2"))
	for _, tg := range []relaycore.Partition{"idle00", "idle39"} {
		if n := idleItems(t, e, tg); n == 0 {
			t.Fatalf("%s has no figures before the TTL", tg)
		}
	}

	e.clock.Advance(2 * time.Hour)
	e.enqueue(put("busy", "k", "b"))
	collected := 0
	for range 5 {
		ar, ok := e.alarmOnce()
		if !ok {
			break
		}
		collected += ar.TargetsCollected
	}
	if collected != 40 {
		t.Fatalf("collected %d targets, want the 40 idle ones", collected)
	}
	for i := range 40 {
		tg := relaycore.Partition(fmt.Sprintf("idle%02d", i))
		if n := idleItems(t, e, tg); n != 0 {
			t.Fatalf("%s: %d items left after collection", tg, n)
		}
		if _, err := relaycore.GetTarget(e.ctx, e.src, e.source, tg); !errors.Is(err, relaycore.ErrUnknownTarget) {
			t.Fatalf("GetTarget %s after collection: %v", tg, err)
		}
	}
	ts, _, err := relaycore.ListTargets(e.ctx, e.src, e.source, relaycore.TargetFilter{All: true}, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range ts {
		names = append(names, string(s.Target))
	}
	if got := strings.Join(names, ","); got != "busy,fail,paused,quar" {
		t.Fatalf("listed %s after collection, want busy,fail,paused,quar", got)
	}
	checkPendingMatchesOutbox(t, e)

	// A collected target starts over from zero on both sides.
	e.enqueue(put("idle07", "k", "again"), put("idle07", "k2", "x"))
	if s := status(t, e, "idle07"); s.Pending != 2 || s.Enqueued != 2 || s.Done != 0 {
		t.Fatalf("idle07 enqueued again: %+v", s)
	}
	failing = false
	if _, err := e.h.Release(e.ctx, e.source, "quar", who); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 20)
	if v, _ := e.target("idle07", "k"); v != "again" {
		t.Fatalf("idle07/k = %q after the drain", v)
	}
	if s := status(t, e, "idle07"); s.Pending != 0 || s.Enqueued != 2 || s.Done != 2 {
		t.Fatalf("idle07 after the drain: %+v", s)
	}
	checkPendingMatchesOutbox(t, e)
}

// checkPendingMatchesOutbox: every target's pending count is the rows the
// outbox and its held pages hold for it, and every queued row's target is
// listed.
func checkPendingMatchesOutbox(t *testing.T, e *env) {
	t.Helper()
	v := e.inspect(e.source)
	queued := map[relaycore.Partition]uint64{}
	for _, r := range v.Rows() {
		queued[r.Target]++
	}
	for _, s := range v.Targets {
		if s.Pending != queued[s.Target] {
			t.Errorf("target %s: %d pending, the outbox holds %d", s.Target, s.Pending, queued[s.Target])
		}
		delete(queued, s.Target)
	}
	for tg, n := range queued {
		t.Errorf("target %s: %d rows queued and no figures", tg, n)
	}
}

// The collection batch is guarded on os and rs: an enqueue for an idle
// target that commits between the sweep's reads and its batch, or an
// operator action that claims the source meanwhile, makes it fail, and
// the target keeps exact figures. Without the os guard the enqueue's rows
// would be counted against a deleted record (pending 0 with a row queued). "enqueue unfolded" races a target with its own t/<hex>/e record.
func TestIdleCollectionRaced(t *testing.T) {
	for _, race := range []string{"enqueue", "enqueue unfolded", "pause"} {
		t.Run(race, func(t *testing.T) {
			e := newEnv(t, "paid")
			e.h.IdleTargetTTL = time.Hour
			var rows []relaycore.Row
			if race == "enqueue unfolded" {
				// 32 targets fill os's room first: a and b keep t/<hex>/e
				// records, which the sweep deletes without an os entry.
				for i := range 32 {
					rows = append(rows, put(relaycore.Partition(fmt.Sprintf("f%02d", i)), "k", "1"))
				}
			}
			e.enqueue(append(rows, put("a", "k", "1"), put("b", "k", "1"))...)
			e.drain(e.source, 5)
			e.clock.Advance(2 * time.Hour)
			// Everything but a is active again: a alone is idle.
			for i := range rows {
				rows[i] = put(rows[i].Target, "k", "2")
			}
			e.enqueue(append(rows, put("b", "k", "2"))...)
			raced := false
			e.srcF.set(func(c call) error {
				if !isSweep(c) || raced {
					return nil
				}
				raced = true
				switch race {
				case "enqueue", "enqueue unfolded":
					if _, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("a", "k", "2")}, relaycore.EnqueueConfig{}); err != nil {
						t.Errorf("racing enqueue: %v", err)
					}
				case "pause":
					h := *e.h
					h.Source = e.src
					if _, err := h.Pause(e.ctx, e.source, "a", relaycore.Actor{By: "op"}); err != nil {
						t.Errorf("racing pause: %v", err)
					}
				}
				return nil
			}, nil)
			ar, ok := e.alarmOnce()
			if !ok || !raced {
				t.Fatalf("no sweep ran (alarm %v, raced %v)", ok, raced)
			}
			if ar.TargetsCollected != 0 {
				t.Fatalf("the raced sweep collected %d targets", ar.TargetsCollected)
			}
			e.srcF.set(nil, nil)
			s := status(t, e, "a")
			switch race {
			case "enqueue", "enqueue unfolded":
				if s.Pending != 1 || s.Enqueued != 2 {
					t.Fatalf("a after the raced sweep: %+v", s)
				}
			case "pause":
				if s.State != relaycore.StatePaused {
					t.Fatalf("a after the raced sweep: %+v", s)
				}
			}
			checkPendingMatchesOutbox(t, e)
		})
	}
}

// The other order: an enqueue reads a's t/<hex>/e record, the sweep then
// collects a (whose counters are not folded into os), and the enqueue's
// batch comes last. The sweep rewrites os so the enqueue's os guard fails
// and it replans from zero; leaving os as it was let the enqueue write a's
// record back with its old count: pending 2 with one row queued
// (relaycore/sim seed 590 found it).
func TestIdleCollectionBetweenEnqueueReadAndCommit(t *testing.T) {
	e := newEnv(t, "paid")
	e.h.IdleTargetTTL = time.Hour
	var rows []relaycore.Row
	for i := range 32 { // fill os's room: a keeps a t/<hex>/e record
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("f%02d", i)), "k", "1"))
	}
	e.enqueue(append(rows, put("a", "k", "1"))...)
	e.drain(e.source, 5)
	e.clock.Advance(2 * time.Hour)
	for i := range rows {
		rows[i] = put(rows[i].Target, "k", "2") // all but a active again
	}
	e.enqueue(rows...)
	swept := 0
	inHook := false
	e.srcF.set(func(c call) error {
		if inHook || c.Op != "apply" || len(c.Batch.Writes) == 0 || c.Batch.Writes[0].Key != relaycore.KeyOS {
			return nil
		}
		for _, w := range c.Batch.Writes {
			if w.Key == "t/61/e" && swept == 0 {
				// a's enqueue has read its record: a sweep runs now
				// (alone: an alarm would also re-arm the alarm record,
				// which the enqueue guards too).
				inHook = true
				n, err := e.h.SweepIdle(e.ctx, e.source)
				inHook = false
				if err != nil {
					t.Errorf("sweep: %v", err)
				}
				swept = n + 1
			}
		}
		return nil
	}, nil)
	if _, err := e.h.Enqueue(e.ctx, e.source, []relaycore.Row{put("a", "k", "2")}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	e.srcF.set(nil, nil)
	if swept != 2 {
		t.Fatalf("the sweep collected %d targets, want a alone", swept-1)
	}
	if s := status(t, e, "a"); s.Pending != 1 || s.Enqueued != 1 || s.Done != 0 {
		t.Fatalf("a after the enqueue that raced its collection: %+v", s)
	}
	checkPendingMatchesOutbox(t, e)
}
