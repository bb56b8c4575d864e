package storetest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// getManyCases prove relaycore.GetMany over the store: its BatchGetter
// when it has one, the Get fallback otherwise. Every result is also checked
// against Get, key by key.
func getManyCases() []suiteCase {
	return []suiteCase{
		{"EmptyList", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1")))
			for _, keys := range [][]string{nil, {}} {
				for _, p := range []relaycore.Partition{"p", "never-written"} {
					m, err := relaycore.GetMany(t.Context(), s, p, keys)
					if err != nil || m == nil || len(m) != 0 {
						t.Fatalf("get many %s %q = %v, %v; want an empty non-nil map", p, keys, m, err)
					}
				}
			}
		}},
		{"AbsentPartition", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1")))
			wantMany(t, s, "never-written", []string{"a", "b"}, map[string]string{})
		}},
		{"FoundAbsentMixed", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", relaycore.Batch{Writes: []relaycore.Write{
				put("a", "1"), put("c", "3"), put("ab", "x"),
				{Key: "nil", Value: nil}, {Key: "empty", Value: []byte{}},
			}})
			// "" and an over-long key cannot have been written: absent,
			// not an error.
			keys := []string{"b", "a", "zz", "c", "nil", "empty", "a\x00", "A", "", strings.Repeat("k", 5000)}
			wantMany(t, s, "p", keys, map[string]string{"a": "1", "c": "3", "nil": "", "empty": ""})
			wantMany(t, s, "p", []string{"nope"}, map[string]string{})
		}},
		{"Duplicates", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1"), put("b", "2")))
			wantMany(t, s, "p", []string{"a", "a", "x", "b", "x", "a", "b"}, map[string]string{"a": "1", "b": "2"})
		}},
		{"NonASCIIAndLongKeys", func(t *testing.T, s relaycore.Store) {
			// The longest keys every store takes: 1000 ASCII bytes, and 500
			// bytes >= 0x80 (1000 bytes once a text store widens them).
			long := strings.Repeat("L", 1000)
			wide := strings.Repeat("é", 250)
			want := map[string]string{
				"é": "e-acute", "日本": "nihon", "\xff": "ff", "\xff\xfe": "fffe", "\x00": "nul",
				"\x7f": "del", long: "long", wide: "wide",
			}
			var ws []relaycore.Write
			for k, v := range want {
				ws = append(ws, put(k, v))
			}
			mustApply(t, s, "p", relaycore.Batch{Writes: ws})
			keys := slices.Sorted(maps.Keys(want))
			keys = append(keys, "e", "\xfe", "日", long[:999], wide[:498], long+"x")
			wantMany(t, s, "p", keys, want)
		}},
		{"ManyKeys", func(t *testing.T, s relaycore.Store) {
			// More than DynamoDB's 100 keys per BatchGetItem, so the list
			// is split; every third key is absent.
			const n = 250
			want := map[string]string{}
			var keys []string
			var ws []relaycore.Write
			for i := range n {
				k := fmt.Sprintf("target/%04d", i)
				keys = append(keys, k)
				if i%3 == 2 {
					continue
				}
				want[k] = fmt.Sprintf("value %d %s", i, bytes.Repeat([]byte{'v'}, i))
				ws = append(ws, put(k, want[k]))
				if len(ws) == 50 {
					mustApply(t, s, "p", relaycore.Batch{Writes: ws})
					ws = nil
				}
			}
			mustApply(t, s, "p", relaycore.Batch{Writes: ws})
			// In reverse order, with the first keys repeated at the end.
			slices.Reverse(keys)
			keys = append(keys, keys[:120]...)
			wantMany(t, s, "p", keys, want)
		}},
		{"ReadYourWrites", func(t *testing.T, s relaycore.Store) {
			keys := []string{"a", "b", "c"}
			wantMany(t, s, "p", keys, map[string]string{})
			mustApply(t, s, "p", writes(put("a", "1"), put("b", "2")))
			wantMany(t, s, "p", keys, map[string]string{"a": "1", "b": "2"})
			mustApply(t, s, "p", relaycore.Batch{
				Preconditions: []relaycore.Precondition{is("a", "1"), absent("c")},
				Writes:        []relaycore.Write{del("a"), put("b", "2'"), put("c", "3")},
			})
			wantMany(t, s, "p", keys, map[string]string{"b": "2'", "c": "3"})
			mustApply(t, s, "p", writes(del("b"), del("c")))
			wantMany(t, s, "p", keys, map[string]string{})
		}},
		{"PartitionsDoNotLeak", func(t *testing.T, s relaycore.Store) {
			parts := []relaycore.Partition{"p", "p/x", "pp", "q", "é"}
			for _, p := range parts {
				mustApply(t, s, p, writes(put("k", "in "+string(p)), put("x/k", "x in "+string(p))))
			}
			mustApply(t, s, "only", writes(put("mine", "1")))
			keys := []string{"k", "x/k", "mine", "p/k", "/k"}
			for _, p := range parts {
				wantMany(t, s, p, keys, map[string]string{"k": "in " + string(p), "x/k": "x in " + string(p)})
			}
			wantMany(t, s, "only", keys, map[string]string{"mine": "1"})
		}},
		{"CopySemantics", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "original"), put("b", "other")))
			keys := []string{"a", "b"}
			m, err := relaycore.GetMany(t.Context(), s, "p", keys)
			if err != nil {
				t.Fatal(err)
			}
			copy(m["a"], "XXXXXXXX")
			keys[1] = "zzz"
			wantValue(t, s, "p", "a", "original")
			if string(m["b"]) != "other" {
				t.Fatalf("result changed with the caller's key slice: %q", m["b"])
			}
		}},
		{"CancelledContext", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1")))
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if m, err := relaycore.GetMany(ctx, s, "p", []string{"a"}); err == nil {
				t.Fatalf("get many with a cancelled context = %v, nil; want an error", m)
			}
		}},
	}
}

// wantMany checks that GetMany of keys in p returns exactly want (a
// present key with a non-nil, possibly empty value), and that Get agrees
// on every key asked for.
func wantMany(t *testing.T, s relaycore.Store, p relaycore.Partition, keys []string, want map[string]string) {
	t.Helper()
	got, err := relaycore.GetMany(t.Context(), s, p, keys)
	if err != nil {
		t.Fatalf("get many %s (%d keys): %v", p, len(keys), err)
	}
	if got == nil {
		t.Fatalf("get many %s: nil map", p)
	}
	for k, v := range got {
		w, ok := want[k]
		switch {
		case !ok:
			t.Fatalf("get many %s: key %q = %q, want absent", p, clipKey(k), v)
		case v == nil:
			t.Fatalf("get many %s: key %q present with a nil value; want non-nil", p, clipKey(k))
		case string(v) != w:
			t.Fatalf("get many %s: key %q = %q, want %q", p, clipKey(k), v, w)
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok && slices.Contains(keys, k) {
			t.Fatalf("get many %s: key %q missing, want %q", p, clipKey(k), want[k])
		}
	}
	for _, k := range keys {
		v, ok, err := s.Get(t.Context(), p, k)
		if err != nil {
			t.Fatalf("get %s/%q: %v", p, clipKey(k), err)
		}
		if g, gok := got[k]; ok != gok || !bytes.Equal(v, g) {
			t.Fatalf("get %s/%q = %q, %v; get many says %q, %v", p, clipKey(k), v, ok, g, gok)
		}
	}
}

func clipKey(k string) string {
	if len(k) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", k[:40], len(k))
	}
	return k
}
