package relaycore_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// rearmRace runs an alarm that delivers 12 rows in its one Free fire and
// leaves 4, with another writer re-arming the alarm at theirMS (offset
// from now) just before the alarm's own re-arm lands: what a fast kick's
// fire that found nothing left, backing off, or an enqueue, does between
// two alarms of a draining invocation. It returns the alarm's result and
// the alarm record's due time after it.
func rearmRace(t *testing.T, theirOffsetMS int64) (relaycore.AlarmResult, int64, int64) {
	t.Helper()
	e := newEnv(t, "free")
	b := e.h.Budget
	b.FiresPerAlarm = 1
	e.h.Budget = b
	var rows []relaycore.Row
	for i := range 12 {
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("t%02d", i)), "k", "v"))
	}
	e.enqueue(rows...)
	// Later than the enqueue's due time, so the re-arm writes the alarm.
	e.clock.Set(e.clock.Now().Add(100 * time.Millisecond))
	now := e.clock.Now().UnixMilli()
	their := now + theirOffsetMS
	raced := false
	e.srcF.set(func(c call) error {
		if raced || c.Op != "apply" || c.Key != relaycore.KeyAlarm {
			return nil
		}
		raced = true
		v, _ := json.Marshal(relaycore.AlarmRecord{DueMS: their})
		return e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyAlarm, Value: v, Due: their}}})
	}, nil)
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if !raced || ar.RowsDelivered != 8 || !ar.Progress || ar.Cleared {
		t.Fatalf("alarm %+v (raced %v): want 8 rows delivered, progress, 4 left", ar, raced)
	}
	raw, found, err := e.src.Get(e.ctx, e.source, relaycore.KeyAlarm)
	if err != nil || !found {
		t.Fatalf("alarm record: %v, found %v", err, found)
	}
	var a relaycore.AlarmRecord
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	return ar, a.DueMS, now
}

// TestRearmKeepsAnEarlierAlarmAndSaysSo: an alarm that made progress and
// finds, at its re-arm, the alarm re-armed meanwhile for no later than its
// own due time keeps that one and reports it as NextDueMS, so the source
// still reads as due now and the fire function goes on draining it. It
// reported no due time (0), which lambda/fire read as "do not continue",
// and a draining source waited seconds for a schedule.
func TestRearmKeepsAnEarlierAlarmAndSaysSo(t *testing.T) {
	ar, due, now := rearmRace(t, -50)
	if ar.NextDueMS != now-50 || due != now-50 {
		t.Errorf("NextDueMS %d, alarm due %d; want both the other writer's %d", ar.NextDueMS, due, now-50)
	}
}

// TestRearmReplacesALaterAlarm: one re-armed meanwhile for later than the
// alarm's own due time (a back-off that did not see its progress) is
// re-armed at the alarm's: due now.
func TestRearmReplacesALaterAlarm(t *testing.T) {
	ar, due, now := rearmRace(t, 60_000)
	if ar.NextDueMS != now || due != now {
		t.Errorf("NextDueMS %d, alarm due %d; want both now (%d), not the later %d", ar.NextDueMS, due, now, now+60_000)
	}
}
