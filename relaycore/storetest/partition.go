package storetest

import (
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func partitionCases() []suiteCase {
	return []suiteCase{
		{"Isolated", func(t *testing.T, s relaycore.Store) {
			// Names that are prefixes of each other must not share keys
			// (a store that concatenates partition and key without a
			// separator would mix "p"+"x/k" with "p/x"+"k").
			parts := []relaycore.Partition{"p", "p/x", "pp", "q", "é"}
			for _, p := range parts {
				mustApply(t, s, p, writes(put("k", "in "+string(p)), put("x/k", "x in "+string(p))))
			}
			for _, p := range parts {
				wantValue(t, s, p, "k", "in "+string(p))
				if got := snapshot(t, s, p); len(got) != 2 {
					t.Fatalf("partition %s lists %s, want its own two keys", p, fmtItems(got))
				}
			}
			mustApply(t, s, "p", writes(del("k")))
			wantAbsent(t, s, "p", "k")
			wantValue(t, s, "pp", "k", "in pp")
			wantValue(t, s, "p/x", "k", "in p/x")
		}},
		{"PreconditionsArePerPartition", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "a", writes(put("k", "1")))
			// "k" exists in a, not in b: Absent holds in b.
			mustApply(t, s, "b", relaycore.Batch{
				Preconditions: []relaycore.Precondition{absent("k")},
				Writes:        []relaycore.Write{put("k", "2")},
			})
			bad := relaycore.Batch{Preconditions: []relaycore.Precondition{is("k", "1")}, Writes: []relaycore.Write{put("k", "3")}}
			wantConditionFailed(t, s.Apply(t.Context(), "b", bad), bad, 0)
			wantValue(t, s, "a", "k", "1")
			wantValue(t, s, "b", "k", "2")
		}},
		{"ScanDoesNotCross", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("z", "1")))
			mustApply(t, s, "pa", writes(put("a", "1")))
			mustApply(t, s, "o", writes(put("m", "1")))
			for _, limit := range []int{0, 1} {
				got := scanAll(t, s, "p", relaycore.ScanRequest{Limit: limit})
				if len(got) != 1 || got[0].Key != "z" {
					t.Fatalf("scan p (limit %d) = %s, want only z", limit, fmtItems(got))
				}
			}
		}},
	}
}
