package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// seedState is the state the precondition tests start from: "a" holds "1",
// "e" is present with an empty value, "z" is absent.
func seedState(t *testing.T, s relaycore.Store, p relaycore.Partition) {
	t.Helper()
	mustApply(t, s, p, relaycore.Batch{Writes: []relaycore.Write{
		put("a", "1"),
		{Key: "e", Value: []byte{}},
		put("m", "keep"),
	}})
}

func applyCases() []suiteCase {
	return []suiteCase{
		{"PreconditionsThatHold", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			b := relaycore.Batch{
				Preconditions: []relaycore.Precondition{
					is("a", "1"),
					{Key: "e", Value: []byte{}},
					{Key: "e", Value: nil}, // nil and empty are the same value
					absent("z"),
				},
				Writes: []relaycore.Write{put("w", "written")},
			}
			mustApply(t, s, "p", b)
			wantValue(t, s, "p", "w", "written")
		}},
		{"PreconditionOnlyBatch", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			before := snapshot(t, s, "p")
			mustApply(t, s, "p", relaycore.Batch{Preconditions: []relaycore.Precondition{is("a", "1")}})
			b := relaycore.Batch{Preconditions: []relaycore.Precondition{is("a", "2")}}
			wantConditionFailed(t, s.Apply(t.Context(), "p", b), b, 0)
			wantUnchanged(t, s, "p", before)
		}},
		{"FailedPreconditionIndex", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			before := snapshot(t, s, "p")
			holding := []relaycore.Precondition{is("a", "1"), {Key: "e", Value: []byte{}}, absent("z"), is("m", "keep")}
			failing := []struct {
				name string
				pc   relaycore.Precondition
			}{
				{"AbsentOnPresent", absent("a")},
				{"AbsentOnEmptyValue", absent("e")},
				{"ValueMismatch", is("a", "2")},
				{"ValuePrefix", is("a", "")},
				{"ValueLonger", is("a", "11")},
				{"EmptyValueOnAbsent", relaycore.Precondition{Key: "z", Value: []byte{}}},
				{"NilValueOnAbsent", relaycore.Precondition{Key: "z"}},
				{"NonEmptyOnEmpty", is("e", "x")},
			}
			for _, f := range failing {
				for i := range len(holding) + 1 {
					t.Run(fmt.Sprintf("%s/index%d", f.name, i), func(t *testing.T) {
						pcs := make([]relaycore.Precondition, 0, len(holding)+1)
						pcs = append(pcs, holding[:i]...)
						pcs = append(pcs, f.pc)
						pcs = append(pcs, holding[i:]...)
						b := relaycore.Batch{
							Preconditions: pcs,
							Writes: []relaycore.Write{
								put("new1", "x"), del("m"), put("a", "changed"),
								{Key: "e", Value: []byte("filled"), Due: 1},
							},
						}
						wantConditionFailed(t, s.Apply(t.Context(), "p", b), b, i)
						wantUnchanged(t, s, "p", before)
					})
				}
			}
		}},
		{"SeveralFalseNamesOneOfThem", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			before := snapshot(t, s, "p")
			b := relaycore.Batch{
				Preconditions: []relaycore.Precondition{is("a", "1"), absent("a"), absent("z"), is("m", "other")},
				Writes:        []relaycore.Write{put("x", "1")},
			}
			err := s.Apply(t.Context(), "p", b)
			i, ok := relaycore.FailedPrecondition(err)
			if !ok || (i != 1 && i != 3) {
				t.Fatalf("apply = %v; want a ConditionFailedError naming precondition 1 or 3", err)
			}
			wantConditionFailed(t, err, b, i)
			wantUnchanged(t, s, "p", before)
		}},
		{"PreconditionAndWriteOnOneKey", func(t *testing.T, s relaycore.Store) {
			// Create-if-absent.
			create := relaycore.Batch{Preconditions: []relaycore.Precondition{absent("k")}, Writes: []relaycore.Write{put("k", "1")}}
			mustApply(t, s, "p", create)
			wantValue(t, s, "p", "k", "1")
			wantConditionFailed(t, s.Apply(t.Context(), "p", create), create, 0)
			wantValue(t, s, "p", "k", "1")

			// Compare-and-swap, the write listed before other keys' guards.
			cas := relaycore.Batch{
				Preconditions: []relaycore.Precondition{absent("other"), is("k", "1")},
				Writes:        []relaycore.Write{put("k", "2"), put("log", "1->2")},
			}
			mustApply(t, s, "p", cas)
			wantValue(t, s, "p", "k", "2")
			before := snapshot(t, s, "p")
			wantConditionFailed(t, s.Apply(t.Context(), "p", cas), cas, 1)
			wantUnchanged(t, s, "p", before)

			// Compare-and-delete.
			cad := relaycore.Batch{Preconditions: []relaycore.Precondition{is("k", "2")}, Writes: []relaycore.Write{del("k")}}
			mustApply(t, s, "p", cad)
			wantAbsent(t, s, "p", "k")
			before = snapshot(t, s, "p")
			wantConditionFailed(t, s.Apply(t.Context(), "p", cad), cad, 0)
			wantUnchanged(t, s, "p", before)

			// Guarded delete of an absent key.
			mustApply(t, s, "p", relaycore.Batch{Preconditions: []relaycore.Precondition{absent("k")}, Writes: []relaycore.Write{del("k")}})
			wantAbsent(t, s, "p", "k")
		}},
		{"PreconditionsSeeStateBeforeBatch", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "old")))
			// The write to "a" precedes the guard on "a" in the batch; the
			// guard still sees the old value.
			b := relaycore.Batch{
				Preconditions: []relaycore.Precondition{absent("n"), is("a", "old")},
				Writes:        []relaycore.Write{put("a", "new"), put("n", "1")},
			}
			mustApply(t, s, "p", b)
			wantValue(t, s, "p", "a", "new")
			wantValue(t, s, "p", "n", "1")
		}},
		{"DuplicatePreconditions", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			ok := relaycore.Batch{
				Preconditions: []relaycore.Precondition{is("a", "1"), is("a", "1")},
				Writes:        []relaycore.Write{put("a", "2")},
			}
			mustApply(t, s, "p", ok)
			wantValue(t, s, "p", "a", "2")
			before := snapshot(t, s, "p")
			bad := relaycore.Batch{
				Preconditions: []relaycore.Precondition{is("a", "2"), is("a", "3")},
				Writes:        []relaycore.Write{put("a", "4")},
			}
			wantConditionFailed(t, s.Apply(t.Context(), "p", bad), bad, 1)
			wantUnchanged(t, s, "p", before)
		}},
		{"ManyWritesAllOrNothing", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("guard", "g1")))
			var ws []relaycore.Write
			for i := range 40 {
				ws = append(ws, put(fmt.Sprintf("k%02d", i), "v"))
			}
			b := relaycore.Batch{Preconditions: []relaycore.Precondition{is("guard", "g0")}, Writes: ws}
			before := snapshot(t, s, "p")
			wantConditionFailed(t, s.Apply(t.Context(), "p", b), b, 0)
			wantUnchanged(t, s, "p", before)
			b.Preconditions[0] = is("guard", "g1")
			mustApply(t, s, "p", b)
			if got := snapshot(t, s, "p"); len(got) != 41 {
				t.Fatalf("after the guarded batch: %d items, want 41", len(got))
			}
		}},
		{"CancelledContext", func(t *testing.T, s relaycore.Store) {
			seedState(t, s, "p")
			before := snapshot(t, s, "p")
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := s.Apply(ctx, "p", writes(put("a", "changed"), put("x", "1"))); err == nil {
				t.Fatal("apply with a cancelled context succeeded")
			}
			wantUnchanged(t, s, "p", before)
			if _, _, err := s.Get(ctx, "p", "a"); err == nil {
				t.Fatal("get with a cancelled context succeeded")
			}
		}},
	}
}
