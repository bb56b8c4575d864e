package storetest

import (
	"fmt"
	"math"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func looseDeleter(t *testing.T, s relaycore.Store) relaycore.LooseDeleter {
	t.Helper()
	d, ok := s.(relaycore.LooseDeleter)
	if !ok {
		t.Skipf("%T does not implement relaycore.LooseDeleter", s)
	}
	return d
}

func mustDeleteLoose(t *testing.T, d relaycore.LooseDeleter, p relaycore.Partition, keys ...string) {
	t.Helper()
	if err := d.DeleteLoose(t.Context(), p, keys); err != nil {
		t.Fatalf("delete loose %s %q: %v", p, keys, err)
	}
}

// wantKeysOf checks that p holds exactly keys (in order), with the values
// they were written with.
func wantKeysOf(t *testing.T, s relaycore.Store, p relaycore.Partition, keys ...string) {
	t.Helper()
	got := snapshot(t, s, p)
	var names []string
	for _, it := range got {
		names = append(names, it.Key)
	}
	if fmt.Sprint(names) != fmt.Sprint(keys) {
		t.Fatalf("%s holds %q, want %q", p, names, keys)
	}
	for _, it := range got {
		if string(it.Value) != "v "+it.Key {
			t.Fatalf("%s/%q = %q, want %q", p, it.Key, it.Value, "v "+it.Key)
		}
	}
}

// putAll writes keys with the value "v <key>", in batches the store takes.
func putAll(t *testing.T, s relaycore.Store, p relaycore.Partition, keys ...string) {
	t.Helper()
	var ws []relaycore.Write
	for _, k := range keys {
		ws = append(ws, put(k, "v "+k))
		if len(ws) == 20 {
			mustApply(t, s, p, relaycore.Batch{Writes: ws})
			ws = nil
		}
	}
	if len(ws) > 0 {
		mustApply(t, s, p, relaycore.Batch{Writes: ws})
	}
}

// looseDeleteCases prove relaycore.LooseDeleter on stores that implement
// it; the others skip them.
func looseDeleteCases() []suiteCase {
	return []suiteCase{
		{"PresentAndAbsent", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			putAll(t, s, "p", "a", "b", "c", "d")
			mustDeleteLoose(t, d, "p", "c", "absent", "a")
			wantKeysOf(t, s, "p", "b", "d")
			wantAbsent(t, s, "p", "a")
			// Deleting again is safe.
			mustDeleteLoose(t, d, "p", "c", "a")
			wantKeysOf(t, s, "p", "b", "d")
		}},
		{"RepeatedKeys", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			putAll(t, s, "p", "a", "b", "c")
			mustDeleteLoose(t, d, "p", "a", "a", "c", "a", "c", "nope", "nope")
			wantKeysOf(t, s, "p", "b")
		}},
		{"ManyKeys", func(t *testing.T, s relaycore.Store) {
			// More than DynamoDB's 25 requests per BatchWriteItem, and not
			// a multiple of it; every fourth key stays.
			d := looseDeleter(t, s)
			var all, del, keep []string
			for i := range 70 {
				k := fmt.Sprintf("r/%04d", i)
				all = append(all, k)
				if i%4 == 3 {
					keep = append(keep, k)
				} else {
					del = append(del, k)
				}
			}
			putAll(t, s, "p", all...)
			mustDeleteLoose(t, d, "p", append(del, del[:10]...)...)
			wantKeysOf(t, s, "p", keep...)
		}},
		{"OtherPartitionsUntouched", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			parts := []relaycore.Partition{"p", "p/x", "pp", "q", "é"}
			for _, p := range parts {
				putAll(t, s, p, "k", "x/k")
			}
			mustDeleteLoose(t, d, "p", "k", "x/k", "p/x", "/k")
			wantKeysOf(t, s, "p")
			for _, p := range parts[1:] {
				wantKeysOf(t, s, p, "k", "x/k")
			}
		}},
		{"NonASCIIKeys", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			putAll(t, s, "p", "é", "\xff", "\x00", "e")
			mustDeleteLoose(t, d, "p", "é", "\xff", "\x00")
			wantKeysOf(t, s, "p", "e")
		}},
		{"EmptyList", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			putAll(t, s, "p", "a")
			for _, keys := range [][]string{nil, {}} {
				for _, p := range []relaycore.Partition{"p", "never-written"} {
					if err := d.DeleteLoose(t.Context(), p, keys); err != nil {
						t.Fatalf("delete loose %s %q = %v, want nil", p, keys, err)
					}
				}
			}
			wantKeysOf(t, s, "p", "a")
		}},
		{"LeavesTheDueIndex", func(t *testing.T, s relaycore.Store) {
			d := looseDeleter(t, s)
			di := dueIndex(t, s)
			mustApply(t, s, "p", writes(putDue("alarm", "a", 100), putDue("other", "b", 200)))
			mustDeleteLoose(t, d, "p", "alarm")
			wantDue(t, di, math.MaxInt64, 10, entry("p", "other", 200))
		}},
	}
}
