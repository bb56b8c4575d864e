package relaycore_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// A SourceInspector's view equals InspectSource's after every change to
// the source: enqueues that add pages and move os, fires that rewrite and
// delete pages and records, an automatic quarantine that moves pages aside, a skip
// into the archive, a release and a pause. Only the decoding is reused,
// never a stale item.
func TestSourceInspectorMatchesInspectSource(t *testing.T) {
	e := newEnv(t, "free")
	e.h.QuarantineAfter = 2 // the second failed round quarantines, moving pages aside
	var in relaycore.SourceInspector
	checks := 0
	compare := func(c call) error {
		want, err := relaycore.InspectSource(e.ctx, e.src, e.source)
		if err != nil {
			t.Fatal(err)
		}
		got, err := in.Inspect(e.ctx, e.src, e.source)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after source call %d (%s %s): inspector view\n%+v\nInspectSource\n%+v", c.N, c.Op, c.Key, got, want)
		}
		checks++
		return nil
	}
	e.srcF.set(nil, compare)
	poison := true
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && c.P == "t" && poison {
			return errInjected
		}
		return nil
	}, nil)
	if _, err := relaycore.AcquireLease(e.ctx, e.srcF, e.source, "holder", time.Minute, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	enqueue := func(rows ...relaycore.Row) {
		t.Helper()
		if _, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	alarms := func() {
		t.Helper()
		for range 100 {
			if _, ok := e.alarmOnce(); !ok {
				return
			}
		}
		t.Fatal("alarms did not finish")
	}
	for i := range 5 {
		var rows []relaycore.Row
		for _, tg := range []relaycore.Partition{"t", "u", "v"} {
			rows = append(rows, put(tg, fmt.Sprintf("k%d", i), fmt.Sprintf("value %d of %s, long enough to compress: %0100d", i, tg, i)))
		}
		enqueue(rows...)
		e.alarmOnce()
		e.clock.Advance(time.Minute) // past t's back-off: each turn is a round
	}
	if s := status(t, e, "t"); s.State != relaycore.StateQuarantined { // failing from the start
		t.Fatalf("t not quarantined: %+v", s)
	}
	if _, err := e.h.Pause(e.ctx, e.source, "u", relaycore.Actor{By: "op", Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	enqueue(put("t", "late", "x"), put("u", "late", "y"), put("v", "late", "z"))
	alarms()
	s := status(t, e, "t")
	if _, err := e.h.Skip(e.ctx, e.source, relaycore.SkipRequest{Target: "t", ExpectFirst: s.FirstSeq, Through: s.FirstSeq, Actor: relaycore.Actor{By: "op", Reason: "poison"}}); err != nil {
		t.Fatal(err)
	}
	poison = false
	if _, err := e.h.Release(e.ctx, e.source, "t", relaycore.Actor{By: "op", Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Resume(e.ctx, e.source, "u", relaycore.Actor{By: "op", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	alarms()
	v := e.inspect(e.source)
	if len(v.Pages) != 0 || len(v.Held) != 0 || len(v.Archive) != 1 || v.Lease == nil {
		t.Fatalf("end state: %d pages, %d held, %d archive entries, lease %v", len(v.Pages), len(v.Held), len(v.Archive), v.Lease)
	}
	if checks < 20 {
		t.Fatalf("only %d source changes compared", checks)
	}
}
