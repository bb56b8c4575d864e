package storetest

import (
	"bytes"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func getCases() []suiteCase {
	return []suiteCase{
		{"AbsentPartition", func(t *testing.T, s relaycore.Store) {
			v, ok, err := s.Get(t.Context(), "never-written", "k")
			if err != nil || ok || v != nil {
				t.Fatalf("get in absent partition = %q, %v, %v; want nil, false, nil", v, ok, err)
			}
		}},
		{"AbsentKey", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("ab", "1")))
			for _, k := range []string{"a", "abc", "ab\x00", "b", "AB"} {
				v, ok, err := s.Get(t.Context(), "p", k)
				if err != nil || ok || v != nil {
					t.Fatalf("get %q = %q, %v, %v; want nil, false, nil", k, v, ok, err)
				}
			}
		}},
		{"Present", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("k", "v1")))
			wantValue(t, s, "p", "k", "v1")
			mustApply(t, s, "p", writes(put("k", "v2")))
			wantValue(t, s, "p", "k", "v2")
		}},
		{"EmptyValueIsPresent", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(
				relaycore.Write{Key: "nil", Value: nil},
				relaycore.Write{Key: "empty", Value: []byte{}},
			))
			for _, k := range []string{"nil", "empty"} {
				v, ok := mustGet(t, s, "p", k)
				if !ok || len(v) != 0 {
					t.Fatalf("get %q = %q, %v; want empty and present", k, v, ok)
				}
			}
			if got := snapshot(t, s, "p"); len(got) != 2 {
				t.Fatalf("scan = %s, want both empty values listed", fmtItems(got))
			}
		}},
		{"BinaryValue", func(t *testing.T, s relaycore.Store) {
			all := make([]byte, 256)
			for i := range all {
				all[i] = byte(i)
			}
			mustApply(t, s, "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: all}}})
			if v, _ := mustGet(t, s, "p", "k"); !bytes.Equal(v, all) {
				t.Fatalf("binary value did not round-trip: got %x", v)
			}
		}},
		{"CopySemantics", func(t *testing.T, s relaycore.Store) {
			buf := []byte("original")
			mustApply(t, s, "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: buf}}})
			copy(buf, "XXXXXXXX")
			wantValue(t, s, "p", "k", "original")

			v, _ := mustGet(t, s, "p", "k")
			copy(v, "YYYYYYYY")
			wantValue(t, s, "p", "k", "original")

			page, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{})
			if err != nil || len(page.Items) != 1 {
				t.Fatalf("scan = %+v, %v; want one item", page, err)
			}
			copy(page.Items[0].Value, "ZZZZZZZZ")
			wantValue(t, s, "p", "k", "original")

			// The precondition's slice is read at Apply time only.
			pc := []byte("original")
			b := relaycore.Batch{
				Preconditions: []relaycore.Precondition{{Key: "k", Value: pc}},
				Writes:        []relaycore.Write{put("k2", "x")},
			}
			mustApply(t, s, "p", b)
			copy(pc, "changed!")
			wantValue(t, s, "p", "k", "original")
		}},
		{"Delete", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1"), put("b", "2")))
			mustApply(t, s, "p", writes(del("a")))
			wantAbsent(t, s, "p", "a")
			wantValue(t, s, "p", "b", "2")
		}},
		{"DeleteAbsentSucceeds", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "empty", writes(del("nothing")))
			if got := snapshot(t, s, "empty"); len(got) != 0 {
				t.Fatalf("deleting an absent key created %s", fmtItems(got))
			}
			mustApply(t, s, "p", writes(put("a", "1")))
			mustApply(t, s, "p", writes(del("zzz"), del("a"), put("b", "2")))
			wantAbsent(t, s, "p", "a")
			wantValue(t, s, "p", "b", "2")
			mustApply(t, s, "p", writes(del("a")))
			wantValue(t, s, "p", "b", "2")
		}},
		{"DeleteLastKeyEmptiesPartition", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1"), put("b", "2")))
			mustApply(t, s, "p", writes(del("a"), del("b")))
			if got := snapshot(t, s, "p"); len(got) != 0 {
				t.Fatalf("scan after deleting every key = %s, want empty", fmtItems(got))
			}
			// The partition is usable again afterwards.
			mustApply(t, s, "p", relaycore.Batch{
				Preconditions: []relaycore.Precondition{absent("a")},
				Writes:        []relaycore.Write{put("a", "3")},
			})
			wantValue(t, s, "p", "a", "3")
		}},
	}
}
