package relaycore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// An alarm that re-arms with back-off must not postpone a wake-up an
// enqueue wrote meanwhile: the re-arm is guarded on the alarm record as it
// read it (or on its absence), so the enqueuer's earlier due time stands.
func TestAlarmRearmKeepsEnqueuersWakeUp(t *testing.T) {
	for _, tc := range []struct {
		// record: the alarm record when the alarm reads it. "later": due in
		// the future (a back-off from an earlier alarm), so the enqueue
		// rewrites it; "absent": gone (a concurrent clear); "due": already
		// due, so the enqueue keeps it as it is (only os changes) and leaves
		// the wake-up to the alarm under way.
		record string
	}{
		{"later"}, {"absent"}, {"due"},
	} {
		t.Run("alarm record "+tc.record, func(t *testing.T) {
			e := newEnv(t, "free")
			failing := true
			e.failTargets("bad", &failing)
			e.enqueue(put("bad", "k", "v"))
			switch tc.record {
			case "later":
				later := e.clock.Now().Add(time.Hour).UnixMilli()
				if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{
					{Key: relaycore.KeyAlarm, Value: []byte(fmt.Sprintf(`{"due_ms":%d}`, later)), Due: later}}}); err != nil {
					t.Fatal(err)
				}
			case "absent":
				if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Delete: true}}}); err != nil {
					t.Fatal(err)
				}
			case "due":
				// The enqueue's own alarm, due now: the fire below runs it.
			}
			// This alarm's fire makes no progress (its target fails), so it
			// re-arms with back-off. Just before that write, another
			// writer commits a row for a healthy target, with a wake-up due
			// now.
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
				t.Fatalf("alarm record %+v after the re-arm: the wake-up the enqueue wrote or kept (due %d) was postponed", v.Alarm, enqueuedAt)
			}
		})
	}
}
