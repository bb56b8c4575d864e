package relaycore_test

import (
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// An alarm that re-arms with back-off must not postpone a wake-up an
// enqueue wrote meanwhile: the re-arm is guarded on the alarm record as it
// read it (or on its absence), so the enqueuer's earlier due time stands.
func TestAlarmRearmKeepsEnqueuersWakeUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		// absent: the alarm record is gone when the alarm reads it (a
		// concurrent clear); otherwise it is due in the future (back-off
		// from an earlier alarm), so the enqueue rewrites it.
		absent bool
	}{
		{"alarm record due later", false},
		{"alarm record absent", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			failing := true
			e.failTargets("bad", &failing)
			e.enqueue(put("bad", "k", "v"))
			if tc.absent {
				if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Delete: true}}}); err != nil {
					t.Fatal(err)
				}
			} else if ar, err := e.h.Alarm(e.ctx, e.source); err != nil || ar.Progress || ar.NextDueMS <= e.clock.Now().UnixMilli() {
				t.Fatalf("first alarm: %+v, %v; want a back-off", ar, err)
			}
			// This alarm's fire makes no progress either, so it re-arms with
			// back-off. Just before that write, another writer commits a
			// row with a wake-up due now.
			var enqueuedAt int64
			e.srcF.set(func(c call) error {
				if c.Op == "apply" && c.Key == relaycore.KeyAlarm && enqueuedAt == 0 {
					e.clock.Advance(time.Millisecond)
					enqueuedAt = e.clock.Now().UnixMilli()
					e.enqueue(put("good", "k", "v"))
				}
				return nil
			}, nil)
			ar, err := e.h.Alarm(e.ctx, e.source)
			e.srcF.set(nil, nil)
			if err != nil || ar.Progress || enqueuedAt == 0 {
				t.Fatalf("alarm: %+v, %v (enqueued at %d)", ar, err, enqueuedAt)
			}
			v := e.inspect(e.source)
			if v.Alarm == nil || v.Alarm.DueMS > enqueuedAt {
				t.Fatalf("alarm record %+v after the re-arm: the wake-up the enqueue wrote (due %d) was postponed", v.Alarm, enqueuedAt)
			}
		})
	}
}
