package relaycore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// AlarmResult.Progress follows the alarm's last fire: true after delivery
// (re-armed due now), false once only a failing target's rows remain
// (re-armed with back-off). Runtimes continue a source on it.
func TestAlarmProgress(t *testing.T) {
	e := newEnv(t, "free")
	down := errors.New("target down")
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "bad" {
			return down
		}
		return nil
	}, nil)
	rows := []relaycore.Row{put("bad", "k", "v")}
	for i := range 40 { // more targets than one free alarm attempts (2 fires x 8)
		rows = append(rows, put(relaycore.Partition(fmt.Sprintf("good-%02d", i)), "k", "v"))
	}
	e.enqueue(rows...)

	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	if !ar.Progress || ar.RowsDelivered == 0 || ar.Cleared {
		t.Fatalf("first alarm %+v: want progress with rows delivered", ar)
	}
	now := e.clock.Now().UnixMilli()
	if ar.NextDueMS > now {
		t.Fatalf("progress re-armed at %d, after now %d", ar.NextDueMS, now)
	}
	for i := 0; i < 10 && ar.Progress; i++ {
		if ar, err = e.h.Alarm(e.ctx, e.source); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := e.target("good-39", "k"); v != "v" {
		t.Fatal("healthy targets not drained while the alarms made progress")
	}
	if ar.Progress || ar.NextDueMS <= e.clock.Now().UnixMilli() {
		t.Fatalf("alarm stuck behind a failing target %+v: want no progress and a backed-off due", ar)
	}
}
