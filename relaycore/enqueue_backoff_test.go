package relaycore_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// downPace runs a source whose only target, "down", refuses every apply,
// for three minutes on an alarm clock (each alarm runs when it falls due, as
// relay serve's does and as a fast kick does for an alarm due now), with
// one enqueue into "down" and then one into paced every every (0: none).
// It returns the target's apply calls and when it was quarantined (0: not
// by then).
func downPace(t *testing.T, every time.Duration, paced relaycore.Partition) (calls int, quarantinedAfter time.Duration) {
	e := newEnv(t, "free")
	e.h.Kicker = &recordingKicker{}
	var mu sync.Mutex
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && strings.HasPrefix(string(c.P), "down") {
			mu.Lock()
			calls++
			mu.Unlock()
			return errInjected
		}
		return nil
	}, nil)
	start := e.clock.Now()
	enqueue := func(target relaycore.Partition) {
		t.Helper()
		if _, err := e.h.Enqueue(e.ctx, e.source, []relaycore.Row{put(target, "k", "v")}, relaycore.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("down")
	next := start.Add(every)
	for step := start; step.Sub(start) <= 3*time.Minute; step = step.Add(50 * time.Millisecond) {
		e.clock.Set(step)
		if every > 0 && !step.Before(next) {
			enqueue(paced)
			next = next.Add(every)
		}
		for {
			a := e.inspect(e.source).Alarm
			if a == nil || a.DueMS > step.UnixMilli() {
				break
			}
			if _, err := e.h.Alarm(e.ctx, e.source); err != nil {
				t.Fatal(err)
			}
		}
		if quarantinedAfter == 0 {
			ts, _, err := relaycore.ListTargets(e.ctx, e.src, e.source, relaycore.TargetFilter{}, e.clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range ts {
				if s.State == relaycore.StateQuarantined {
					quarantinedAfter = step.Sub(start)
				}
			}
		}
	}
	return calls, quarantinedAfter
}

// TestEnqueueKeepsBackoff: enqueues into a source whose only target is
// down do not speed up its retries: with a row every 5 s the target is
// called, and quarantined, exactly as with a single row, at the pace of
// the source's back-off. Before the rule every enqueue moved the
// backed-off alarm to now and retried the target at once (quarantined
// after 25 s instead of 64 s; with the fast kick on Lambda, one fire per
// enqueue).
func TestEnqueueKeepsBackoff(t *testing.T) {
	alone, qAlone := downPace(t, 0, "")
	busy, qBusy := downPace(t, 5*time.Second, "down")
	t.Logf("one row: %d calls, quarantined after %v; a row every 5 s: %d calls, quarantined after %v", alone, qAlone, busy, qBusy)
	if qAlone == 0 {
		t.Fatalf("the down target was not quarantined within 3 minutes (%d calls)", alone)
	}
	if busy != alone || qBusy != qAlone {
		t.Errorf("a row every 5 s: %d calls, quarantined after %v; want the back-off's %d calls, after %v", busy, qBusy, alone, qAlone)
	}
}

// TestHealthyTrafficKeepsRetryPace: rows for a healthy target of the same
// source, every 100 ms, start a new cycle at nearly every fire; the down
// target is still retried at its own back-off (scans skip it as blocked
// until then), not once per cycle. Before, every new cycle retried it, and
// ten quick fires quarantined it about a second after its first failure.
func TestHealthyTrafficKeepsRetryPace(t *testing.T) {
	alone, qAlone := downPace(t, 0, "")
	busy, qBusy := downPace(t, 100*time.Millisecond, "up")
	t.Logf("alone: %d calls, quarantined after %v; beside a healthy target's row every 100 ms: %d calls, quarantined after %v", alone, qAlone, busy, qBusy)
	// Each retry comes with the first fire after its back-off, which
	// healthy rows make come sooner than the source's alarm: a little
	// earlier, never more calls.
	if busy != alone || qBusy == 0 || qBusy < qAlone-time.Second {
		t.Fatalf("beside a healthy target: %d calls, quarantined after %v; want %d calls, after about %v", busy, qBusy, alone, qAlone)
	}
}

// TestEnqueueBackoffDecision: while the source backs off after a fire in
// which "down" failed, a row for "down" keeps the later alarm and sends no
// kick (KickBackoff); a row for any other target moves the alarm to now
// and kicks (a healthy target does not wait for another's back-off), and
// so does a commit that mixes both.
func TestEnqueueBackoffDecision(t *testing.T) {
	e := newEnv(t, "free")
	kicker := &recordingKicker{}
	e.h.Kicker = kicker
	on := true
	e.failTargets("down", &on)
	commit := func(want relaycore.KickDecision, rows ...relaycore.Row) relaycore.CommitResult {
		t.Helper()
		res, err := e.h.Enqueue(e.ctx, e.source, rows, relaycore.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Kick != want {
			t.Fatalf("kick %s, want %s", res.Kick, want)
		}
		return res
	}
	// backoff runs the alarm once: "down" fails, the fire makes no other
	// progress and the alarm is re-armed later.
	backoff := func() int64 {
		t.Helper()
		if _, ok := e.alarmOnce(); !ok {
			t.Fatal("no alarm")
		}
		a := e.inspect(e.source).Alarm
		if a == nil || a.DueMS <= e.clock.Now().UnixMilli() {
			t.Fatalf("alarm %+v after a failed fire, want a back-off", a)
		}
		return a.DueMS
	}
	commit(relaycore.KickSent, put("down", "k", "v"))
	due := backoff()
	kicks := len(kicker.kicks)
	e.clock.Advance(100 * time.Millisecond)
	if res := commit(relaycore.KickBackoff, put("down", "k", "v2")); res.AlarmDueMS != due {
		t.Fatalf("kept alarm due %d, want %d", res.AlarmDueMS, due)
	}
	if a := e.inspect(e.source).Alarm; a == nil || a.DueMS != due || len(kicker.kicks) != kicks {
		t.Fatalf("alarm %+v, %d kicks: want the back-off due %d kept and no kick", a, len(kicker.kicks)-kicks, due)
	}
	now := e.clock.Now().UnixMilli()
	if res := commit(relaycore.KickSent, put("down", "k", "v3"), put("other", "k", "v")); res.AlarmDueMS != now {
		t.Fatalf("mixed commit: alarm due %d, want now %d", res.AlarmDueMS, now)
	}
	due = backoff()
	e.clock.Advance(100 * time.Millisecond)
	now = e.clock.Now().UnixMilli()
	if res := commit(relaycore.KickSent, put("up", "k", "v")); res.AlarmDueMS != now {
		t.Fatalf("healthy target's row: alarm due %d, want now %d (the back-off was due %d)", res.AlarmDueMS, now, due)
	}
	if _, ok := e.alarmOnce(); !ok {
		t.Fatal("no alarm")
	}
	for _, k := range []relaycore.Partition{"up", "other"} {
		if v, ok := e.target(k, "k"); !ok || v != "v" {
			t.Fatalf("%s/k = %q %v, want delivered", k, v, ok)
		}
	}
}
