package relaycore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

type recordingKicker struct {
	mu    sync.Mutex
	kicks []int64
}

func (k *recordingKicker) Kick(_ context.Context, _ relaycore.Partition, due int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kicks = append(k.kicks, due)
	return nil
}

// alarmItems says how one enqueue batch carries its relay kick: a put of
// the alarm record, or a guard that it holds exactly that due time (which
// it no longer needs: the os guard covers the alarm).
func alarmItems(b relaycore.Batch) (puts, guards int) {
	for _, w := range b.Writes {
		if w.Key == relaycore.KeyAlarm {
			puts++
		}
	}
	for _, pc := range b.Preconditions {
		if pc.Key == relaycore.KeyAlarm {
			guards++
		}
	}
	return puts, guards
}

// Every enqueue batch carries exactly one relay kick. The alarm is written
// when it is absent or due later than now; a later link of the chain keeps
// the record it finds already due, neither rewriting nor checking it (its
// os guard covers the alarm: TestEnqueueRacingAlarmClearReplans), and so do
// an enqueue in the same millisecond and one while a wake-up is still
// pending.
// Exactly one fast-path kick per commit.
func TestEnqueueBatchCarriesOneRelayKick(t *testing.T) {
	e := newEnv(t, "free")
	var batches []relaycore.Batch
	e.srcF.set(func(c call) error {
		if c.Op == "apply" {
			batches = append(batches, c.Batch)
		}
		return nil
	}, nil)
	kicker := &recordingKicker{}
	commit := func(rows []relaycore.Row) relaycore.CommitResult {
		t.Helper()
		res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{Kicker: kicker})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := commit(chainRows(300, "a")) // two links
	if res.Batches != 2 || len(batches) != 2 {
		t.Fatalf("%d batches, want a chain of 2", res.Batches)
	}
	if p, g := alarmItems(batches[0]); p != 1 || g != 0 {
		t.Fatalf("first link: %d alarm puts, %d guards; want the alarm written", p, g)
	}
	if p, g := alarmItems(batches[1]); p != 0 || g != 0 {
		t.Fatalf("second link: %d alarm puts, %d guards; want the alarm kept as it is", p, g)
	}
	commit([]relaycore.Row{put("t", "k", "same ms")})
	if p, g := alarmItems(batches[2]); p != 0 || g != 0 {
		t.Fatalf("same-millisecond enqueue: %d puts, %d guards", p, g)
	}
	e.clock.Advance(time.Millisecond)
	res = commit([]relaycore.Row{put("t", "k", "later")})
	if p, g := alarmItems(batches[3]); p != 0 || g != 0 {
		t.Fatalf("later enqueue: %d puts, %d guards; want the already-due alarm kept, not postponed", p, g)
	}
	if a := e.inspect(e.source).Alarm; a == nil || a.DueMS != res.AlarmDueMS || a.DueMS >= e.clock.Now().UnixMilli() {
		t.Fatalf("alarm %+v, want the earlier due %d", a, res.AlarmDueMS)
	}
	// A fire without progress re-armed the alarm with back-off: an enqueue
	// moves it back to now.
	backoff := e.clock.Now().Add(10 * time.Second).UnixMilli()
	if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Value: []byte(fmt.Sprintf(`{"due_ms":%d}`, backoff)), Due: backoff}}}); err != nil {
		t.Fatal(err)
	}
	res = commit([]relaycore.Row{put("t", "k", "after back-off")})
	if p, g := alarmItems(batches[4]); p != 1 || g != 0 {
		t.Fatalf("enqueue after back-off: %d puts, %d guards; want the alarm moved to now", p, g)
	}
	if a := e.inspect(e.source).Alarm; a == nil || a.DueMS != e.clock.Now().UnixMilli() || res.AlarmDueMS != a.DueMS {
		t.Fatalf("alarm %+v (kick %d), want due now %d", a, res.AlarmDueMS, e.clock.Now().UnixMilli())
	}
	// Only the commits that armed the alarm kick: the two in between found
	// a wake-up due moments ago, already kicked.
	if len(kicker.kicks) != 2 {
		t.Fatalf("%d kicks for 4 commits, 2 of which armed the alarm", len(kicker.kicks))
	}
}

// TestEnqueueKickDecision: an enqueue kicks when it arms the alarm, and
// when it finds the alarm overdue past the grace with no fire holding the
// claim (the wake-up is late or lost); it sends none while a wake-up is on
// its way (due moments ago) or a fire holds the claim, whatever the
// alarm's age. An operator action's claim re-arms nothing, so it does not
// count. Without the decision every commit kicks (4 kicks where 2 are
// wanted here).
func TestEnqueueKickDecision(t *testing.T) {
	e := newEnv(t, "free")
	kicker := &recordingKicker{}
	e.h.Kicker = kicker
	commit := func(want relaycore.KickDecision) relaycore.CommitResult {
		t.Helper()
		res, err := e.h.Enqueue(e.ctx, e.source, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Kick != want {
			t.Fatalf("kick %s, want %s", res.Kick, want)
		}
		return res
	}
	claim := func(owner string, untilMS int64) {
		t.Helper()
		rs := fmt.Sprintf(`{"ver":9,"cycle_end":0,"cursor":0,"claim":{"owner":%q,"until_ms":%d}}`, owner, untilMS)
		if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: []byte(rs)}}}); err != nil {
			t.Fatal(err)
		}
	}
	first := commit(relaycore.KickSent) // absent alarm: armed
	e.clock.Advance(time.Second)
	commit(relaycore.KickPending) // due a second ago
	e.clock.Advance(5 * time.Second)
	claim("fire-token", e.clock.Now().Add(20*time.Second).UnixMilli())
	commit(relaycore.KickClaimed) // overdue, but a fire works on it
	claim("op-token", e.clock.Now().Add(time.Second).UnixMilli())
	if res := commit(relaycore.KickSent); res.AlarmDueMS != first.AlarmDueMS {
		t.Fatalf("kick due %d, want the pending alarm's %d", res.AlarmDueMS, first.AlarmDueMS)
	}
	claim("fire-token", e.clock.Now().UnixMilli()) // lapsed
	commit(relaycore.KickSent)
	if len(kicker.kicks) != 3 {
		t.Fatalf("%d kicks, want 3", len(kicker.kicks))
	}
	e.h.Kicker = nil
	commit(relaycore.KickNone)
}

// An enqueue that finds the alarm already due keeps it without checking it
// and relies on its os guard: the alarm's clear writes os. Here an Alarm
// delivers the outbox and clears the alarm between the enqueue's read and
// its commit (the real race: a fire ending as rows arrive); the enqueue's
// guard fails, its rows are re-planned and arm a new alarm. Were the clear
// not to write os, the rows would be committed with no alarm at all, to wait
// for the source's next enqueue. Both clears: the one batch, and on a store
// that deletes loosely the single writes whose first marks os (clearSingles).
func TestEnqueueRacingAlarmClearReplans(t *testing.T) {
	for _, loose := range []bool{false, true} {
		t.Run(fmt.Sprintf("loose=%v", loose), func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(put("t", "k1", "v1"))
			marks := 0
			var src relaycore.Store = e.src
			if loose {
				inner := &faultStore{Store: e.src}
				inner.set(func(c call) error {
					if isClearMark(c) {
						marks++
					}
					return nil
				}, nil)
				src = &looseStore{faultStore: inner}
			}
			alarm := &relaycore.RelayHandler{Source: src, Target: e.tgt, Budget: e.h.Budget, Clock: e.clock}
			applies := 0
			e.srcF.set(func(c call) error {
				if c.Op != "apply" {
					return nil
				}
				if applies++; applies == 1 {
					ar, err := alarm.Alarm(e.ctx, e.source)
					if err == nil && !ar.Cleared {
						err = fmt.Errorf("alarm %+v did not clear", ar)
					}
					return err
				}
				return nil
			}, nil)
			res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("t", "k2", "v2")}, relaycore.EnqueueConfig{})
			e.srcF.set(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if loose && marks != 1 {
				t.Fatalf("%d clears marked os on the loose store, want 1", marks)
			}
			if res.Replans != 1 {
				t.Fatalf("replans = %d, want 1", res.Replans)
			}
			v := e.inspect(e.source)
			if n := len(v.Rows()); n != 1 {
				t.Fatalf("%d rows in the outbox, want the racing enqueue's 1", n)
			}
			if v.Alarm == nil || v.Alarm.DueMS > res.AlarmDueMS || v.OS.Clearing {
				t.Fatalf("alarm %+v, os clearing %v after the race, want one due by %d and no mark", v.Alarm, v.OS.Clearing, res.AlarmDueMS)
			}
			e.drain(e.source, 5)
			if got, _ := e.target("t", "k2"); got != "v2" {
				t.Fatalf("target k2 = %q after the drain, want v2", got)
			}
		})
	}
}

// The same for a back-off: an Alarm whose fire made no progress (its one
// target failing) moves the alarm past now between an enqueue's read and
// its commit, writing os; the enqueue, whose rows are for a healthy target
// the back-off does not concern, is re-planned and moves the alarm back to
// now instead of leaving its rows to wait out the back-off.
func TestEnqueueRacingBackoffReplans(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("down", "k1", "v1"))
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "down" {
			return errors.New("target down")
		}
		return nil
	}, nil)
	alarm := &relaycore.RelayHandler{Source: e.src, Target: e.tgtF, Budget: e.h.Budget, Clock: e.clock}
	applies := 0
	var backoff relaycore.AlarmResult
	e.srcF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		if applies++; applies == 1 {
			var err error
			backoff, err = alarm.Alarm(e.ctx, e.source)
			return err
		}
		return nil
	}, nil)
	res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("up", "k2", "v2")}, relaycore.EnqueueConfig{})
	e.srcF.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if now := e.clock.Now().UnixMilli(); backoff.NextDueMS <= now {
		t.Fatalf("the racing alarm re-armed at %d, not past now %d: no back-off to race", backoff.NextDueMS, now)
	}
	if res.Replans != 1 {
		t.Fatalf("replans = %d, want 1", res.Replans)
	}
	if v := e.inspect(e.source); v.Alarm == nil || v.Alarm.DueMS > e.clock.Now().UnixMilli() {
		t.Fatalf("alarm %+v after the race, want it due now (%d), not at the back-off", v.Alarm, e.clock.Now().UnixMilli())
	}
}

// deadlineKicker records the deadline of each kick's context and answers
// as a kicker whose service hangs would once that deadline passes.
type deadlineKicker struct {
	left []time.Duration // time left before each kick's deadline, as it began
}

func (k *deadlineKicker) Kick(ctx context.Context, _ relaycore.Partition, _ int64) error {
	d, ok := ctx.Deadline()
	if !ok {
		return errors.New("kick without a deadline")
	}
	k.left = append(k.left, time.Until(d))
	return context.DeadlineExceeded
}

// A kick runs after its rows committed, so it is bounded (3 s) however
// long the caller's context lasts, and a kick that times out is logged,
// never the enqueue's error: a caller never retries rows that committed
// because a kicker's service hung. The same holds for the alarm's kicks.
func TestKickIsBounded(t *testing.T) {
	e := newEnv(t, "free")
	k := &deadlineKicker{}
	e.h.Kicker = k
	res, err := e.h.Enqueue(e.ctx, e.source, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueOptions{})
	if err != nil || len(res.Seqs) != 1 || res.Seqs[0] == 0 {
		t.Fatalf("enqueue whose kick timed out: %+v, %v", res, err)
	}
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" {
			return errInjected // the target fails: the alarm re-arms and kicks
		}
		return nil
	}, nil)
	if _, err := e.h.Alarm(e.ctx, e.source); err != nil {
		t.Fatalf("alarm whose kick timed out: %v", err)
	}
	if len(k.left) < 2 {
		t.Fatalf("%d kicks, want the enqueue's and the alarm's", len(k.left))
	}
	for i, left := range k.left {
		if left > 3*time.Second {
			t.Errorf("kick %d: %v to its deadline, want at most 3 s", i, left)
		}
	}
}
