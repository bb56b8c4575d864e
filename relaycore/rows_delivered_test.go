package relaycore_test

import (
	"errors"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// The rows alarms report delivered add up to the rows that landed, through
// failures: a target batch that lands with its answer lost and the rh read
// that would settle it failing, and the fire's checkpoint failing too, so
// the alarm fails after some of its fires ran. Before, the fire that
// applied those rows could not tell and the fire that found them applied
// did not count them: the sums were short (10,073 reported for 10,075
// applied in the fault runs).
func TestRowsDeliveredAreExactThroughFailures(t *testing.T) {
	for _, mode := range []string{"rh re-read fails", "rh re-read and checkpoint fail", "checkpoint fails"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, "free")
			// One target per fire, so the alarm's first fire delivers t1 and
			// its second meets the faults at t2.
			e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 4, TargetsPerFire: 1, CallsPerTarget: 4, RowsPerFire: 100}
			e.enqueue(put("t1", "a", "1"), put("t1", "b", "2"), put("t1", "c", "3"), put("t2", "a", "4"), put("t2", "b", "5"))
			rh := relaycore.RHKey(e.source)
			t2Applied, t2Reads := false, 0
			lostAnswer := mode != "checkpoint fails"
			e.tgtF.set(func(c call) error {
				if c.Op == "get" && c.P == "t2" && c.Key == rh {
					if t2Reads++; t2Applied && lostAnswer && t2Reads == 2 {
						return errInjected // the read that would settle the lost answer
					}
				}
				return nil
			}, func(c call) error {
				if c.Op == "apply" && c.P == "t2" && !t2Applied {
					t2Applied = true
					if lostAnswer {
						return maybeApplied()
					}
				}
				return nil
			})
			failCheckpoint := mode != "rh re-read fails"
			e.srcF.set(func(c call) error {
				if failCheckpoint && t2Applied && c.Op == "apply" && c.Key == relaycore.KeyRS && len(c.Batch.Writes) > 1 {
					failCheckpoint = false
					return errInjected
				}
				return nil
			}, nil)

			ar, err := e.h.Alarm(e.ctx, e.source)
			if mode != "rh re-read fails" && !errors.Is(err, errInjected) {
				t.Fatalf("alarm = %v, want the injected checkpoint failure", err)
			}
			if mode == "rh re-read fails" && err != nil {
				t.Fatal(err)
			}
			if ar.Fires < 2 || !t2Applied {
				t.Fatalf("alarm %+v (t2 applied %v): the faults were not reached", ar, t2Applied)
			}
			reported := ar.RowsDelivered
			e.srcF.set(nil, nil)
			e.tgtF.set(nil, nil)
			if mode != "rh re-read fails" {
				e.clock.Advance(e.h.ClaimTTLOrDefault()) // a failed fire may leave its claim
			}
			_, total := e.drain(e.source, 20)
			reported += total.RowsDelivered
			for _, kv := range [][3]string{{"t1", "a", "1"}, {"t1", "b", "2"}, {"t1", "c", "3"}, {"t2", "a", "4"}, {"t2", "b", "5"}} {
				if v, ok := e.target(relaycore.Partition(kv[0]), kv[1]); !ok || v != kv[2] {
					t.Fatalf("%s/%s = %q %v, want %q", kv[0], kv[1], v, ok, kv[2])
				}
			}
			if reported != 5 {
				t.Fatalf("alarms reported %d rows delivered, 5 landed (first alarm %+v)", reported, ar)
			}
		})
	}
}
