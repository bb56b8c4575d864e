package storetest

import (
	"fmt"
	"math"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func dueIndex(t *testing.T, s relaycore.Store) relaycore.DueIndex {
	t.Helper()
	d, ok := s.(relaycore.DueIndex)
	if !ok {
		t.Skipf("%T does not implement relaycore.DueIndex", s)
	}
	return d
}

func putDue(key, value string, due int64) relaycore.Write {
	return relaycore.Write{Key: key, Value: []byte(value), Due: due}
}

// wantDue checks Due(before, limit) returns exactly want, in order.
func wantDue(t *testing.T, d relaycore.DueIndex, before int64, limit int, want ...relaycore.DueEntry) {
	t.Helper()
	got, err := d.Due(t.Context(), before, limit)
	if err != nil {
		t.Fatalf("due(%d, %d): %v", before, limit, err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("due(%d, %d) =\n %v\nwant\n %v", before, limit, got, want)
	}
}

func entry(p relaycore.Partition, key string, due int64) relaycore.DueEntry {
	return relaycore.DueEntry{Partition: p, Key: key, Due: due}
}

func dueCases() []suiteCase {
	return []suiteCase{
		{"Listed", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			wantDue(t, d, math.MaxInt64, 10)
			mustApply(t, s, "p1", writes(putDue("alarm", "a", 100), putDue("c", "c", 200), put("plain", "x")))
			mustApply(t, s, "p2", writes(putDue("alarm", "b", 300)))
			wantDue(t, d, 1000, 10, entry("p1", "alarm", 100), entry("p1", "c", 200), entry("p2", "alarm", 300))
			wantDue(t, d, 200, 10, entry("p1", "alarm", 100), entry("p1", "c", 200))
			wantDue(t, d, 199, 10, entry("p1", "alarm", 100))
			wantDue(t, d, 99, 10)
			wantDue(t, d, 1000, 2, entry("p1", "alarm", 100), entry("p1", "c", 200))
			wantDue(t, d, 1000, 1, entry("p1", "alarm", 100))
		}},
		{"OldestFirstAcrossWrites", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			// Written newest first, in several batches and partitions.
			for i := 9; i >= 0; i-- {
				p := relaycore.Partition(fmt.Sprintf("p%d", i%3))
				mustApply(t, s, p, writes(putDue(fmt.Sprintf("k%d", i), "v", int64(1000+i*10))))
			}
			got, err := d.Due(t.Context(), math.MaxInt64, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 10 {
				t.Fatalf("due lists %d entries, want 10: %v", len(got), got)
			}
			for i, e := range got {
				if e.Due != int64(1000+i*10) || e.Key != fmt.Sprintf("k%d", i) {
					t.Fatalf("entry %d = %v, want k%d due %d", i, e, i, 1000+i*10)
				}
			}
		}},
		{"LargeAndSmallTimes", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			// Byte-encoded indexes get the sign and width of int64 wrong
			// easily; real alarms are ~1.7e12 ms.
			mustApply(t, s, "p", writes(
				putDue("late", "v", 1<<50), putDue("now", "v", 1_764_000_000_000), putDue("early", "v", 1), putDue("mid", "v", 256),
			))
			wantDue(t, d, math.MaxInt64, 10,
				entry("p", "early", 1), entry("p", "mid", 256), entry("p", "now", 1_764_000_000_000), entry("p", "late", 1<<50))
			wantDue(t, d, 255, 10, entry("p", "early", 1))
		}},
		{"RePutWithoutDueUnlists", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			mustApply(t, s, "p", writes(putDue("alarm", "a", 100)))
			mustApply(t, s, "p", writes(put("alarm", "b")))
			wantDue(t, d, math.MaxInt64, 10)
			wantValue(t, s, "p", "alarm", "b")
		}},
		{"RePutMovesEntry", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			mustApply(t, s, "p", writes(putDue("alarm", "a", 500)))
			mustApply(t, s, "p", writes(putDue("alarm", "b", 100)))
			wantDue(t, d, math.MaxInt64, 10, entry("p", "alarm", 100))
			mustApply(t, s, "p", writes(putDue("alarm", "c", 900)))
			wantDue(t, d, math.MaxInt64, 10, entry("p", "alarm", 900))
			wantDue(t, d, 500, 10)
		}},
		{"DeleteUnlists", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			mustApply(t, s, "p", writes(putDue("alarm", "a", 100), putDue("other", "o", 200)))
			mustApply(t, s, "p", writes(del("alarm")))
			wantDue(t, d, math.MaxInt64, 10, entry("p", "other", 200))
		}},
		{"SameKeyInTwoPartitions", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			mustApply(t, s, "a", writes(putDue("alarm", "1", 100)))
			mustApply(t, s, "b", writes(putDue("alarm", "1", 100)))
			got, err := d.Due(t.Context(), math.MaxInt64, 10)
			if err != nil || len(got) != 2 || got[0].Partition == got[1].Partition {
				t.Fatalf("due = %v, %v; want the alarm of both partitions", got, err)
			}
			mustApply(t, s, "a", writes(del("alarm")))
			wantDue(t, d, math.MaxInt64, 10, entry("b", "alarm", 100))
		}},
		{"RefusedBatchLeavesIndex", func(t *testing.T, s relaycore.Store) {
			d := dueIndex(t, s)
			mustApply(t, s, "p", writes(putDue("alarm", "a", 100)))
			b := relaycore.Batch{
				Preconditions: []relaycore.Precondition{is("alarm", "other")},
				Writes:        []relaycore.Write{del("alarm"), putDue("new", "n", 50)},
			}
			wantConditionFailed(t, s.Apply(t.Context(), "p", b), b, 0)
			wantDue(t, d, math.MaxInt64, 10, entry("p", "alarm", 100))
			invalid := writes(putDue("x", "1", 10), putDue("x", "2", 20))
			wantRefused(t, s.Apply(t.Context(), "p", invalid), relaycore.ErrInvalidBatch)
			wantDue(t, d, math.MaxInt64, 10, entry("p", "alarm", 100))
		}},
	}
}
