package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// trickyKeys sort in Go (byte) order differently from what naive
// implementations produce: prefixes before their extensions, NUL right
// after a prefix, upper before lower case, DEL (0x7f) before multi-byte
// UTF-8, 0xff (not UTF-8) after every valid UTF-8 byte sequence.
//
// Keys are arbitrary strings in the contract, not just UTF-8; a store whose
// backend only holds UTF-8 strings must encode keys so they round-trip and
// keep byte order.
var trickyKeys = []string{
	"b", "a", "ab", "a\x00", "a\x00b", "aa", "A", "Z", "0", "00", "1", "~",
	"\x01", "\x7f", "é", "日本", "日", "\U0001F600", "\uffff", "\xff", "\xff\xff", "a\xff", " ",
}

func sortedTricky() []string {
	ks := slices.Clone(trickyKeys)
	slices.Sort(ks)
	return ks
}

// loadTricky writes every tricky key with its value derived from the key.
func loadTricky(t *testing.T, s relaycore.Store, p relaycore.Partition) {
	t.Helper()
	var ws []relaycore.Write
	for _, k := range trickyKeys {
		ws = append(ws, relaycore.Write{Key: k, Value: []byte("v:" + k)})
	}
	mustApply(t, s, p, relaycore.Batch{Writes: ws})
}

// wantKeys checks scanned items are exactly keys, with their derived values.
func wantKeys(t *testing.T, what string, got []relaycore.Item, keys []string) {
	t.Helper()
	gotKeys := make([]string, len(got))
	for i, it := range got {
		gotKeys[i] = it.Key
		if string(it.Value) != "v:"+it.Key {
			t.Fatalf("%s: key %q has value %q, want %q", what, it.Key, it.Value, "v:"+it.Key)
		}
	}
	if !slices.Equal(gotKeys, keys) {
		t.Fatalf("%s:\n got  %q\n want %q", what, gotKeys, keys)
	}
}

// expectScan is the reference: keys in [start, end), strictly after after.
func expectScan(sorted []string, req relaycore.ScanRequest) []string {
	var out []string
	for _, k := range sorted {
		if k < req.Start || (req.End != "" && k >= req.End) || (req.After != "" && k <= req.After) {
			continue
		}
		out = append(out, k)
	}
	return out
}

func scanCases() []suiteCase {
	return []suiteCase{
		{"AbsentPartition", func(t *testing.T, s relaycore.Store) {
			page, err := s.Scan(t.Context(), "never-written", relaycore.ScanRequest{Limit: 10})
			if err != nil || len(page.Items) != 0 || page.Next != "" {
				t.Fatalf("scan of absent partition = %+v, %v; want empty page, no Next, nil", page, err)
			}
		}},
		{"ByteOrder", func(t *testing.T, s relaycore.Store) {
			loadTricky(t, s, "p")
			wantKeys(t, "full scan", scanAll(t, s, "p", relaycore.ScanRequest{}), sortedTricky())
		}},
		{"LimitPaging", func(t *testing.T, s relaycore.Store) {
			loadTricky(t, s, "p")
			n := len(trickyKeys)
			for _, limit := range []int{1, 2, 3, n - 1, n, n + 1, 0, -1} {
				got := scanAll(t, s, "p", relaycore.ScanRequest{Limit: limit})
				wantKeys(t, fmt.Sprintf("limit %d", limit), got, sortedTricky())
			}
		}},
		{"LimitOneFirstPage", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1"), put("b", "2")))
			page, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Items) > 1 || page.Next == "" {
				t.Fatalf("first page with limit 1 = %+v; want at most one item and a Next cursor", page)
			}
		}},
		{"Ranges", func(t *testing.T, s relaycore.Store) {
			loadTricky(t, s, "p")
			sorted := sortedTricky()
			bounds := []string{"", "\x00", "a", "a\x00", "aa", "ab", "b", "c", "é", "\xff", "\xff\xff\xff", "A", "zz"}
			for _, start := range bounds {
				for _, end := range bounds {
					for _, limit := range []int{0, 1, 2} {
						req := relaycore.ScanRequest{Start: start, End: end, Limit: limit}
						got := scanAll(t, s, "p", req)
						wantKeys(t, fmt.Sprintf("scan %s", fmtReq(req)), got, expectScan(sorted, req))
					}
				}
			}
		}},
		{"After", func(t *testing.T, s relaycore.Store) {
			loadTricky(t, s, "p")
			sorted := sortedTricky()
			// After on every key, on keys that are absent but sort between
			// present ones, and below Start / at or past End.
			afters := append(slices.Clone(sorted), "a\x00a", "aaa", "\x00", "\xff\xff\xff")
			ranges := []relaycore.ScanRequest{{}, {Start: "a", End: "b"}, {Start: "aa"}, {End: "a\x00b"}}
			for _, r := range ranges {
				for _, after := range afters {
					for _, limit := range []int{0, 1, 3} {
						req := r
						req.After, req.Limit = after, limit
						got := scanAll(t, s, "p", req)
						wantKeys(t, fmt.Sprintf("scan %s", fmtReq(req)), got, expectScan(sorted, req))
					}
				}
			}
		}},
		{"EmptyRange", func(t *testing.T, s relaycore.Store) {
			loadTricky(t, s, "p")
			for _, req := range []relaycore.ScanRequest{
				{Start: "b", End: "a"},
				{Start: "a", End: "a"},
				{Start: "ab\x00", End: "ac"},
				{After: "\xff\xff"},
				{Start: "a", End: "ab", After: "aa"},
			} {
				if got := scanAll(t, s, "p", req); len(got) != 0 {
					t.Fatalf("scan %s = %s, want empty", fmtReq(req), fmtItems(got))
				}
			}
		}},
		{"CursorIsAKey", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "v:a"), put("b", "v:b"), put("c", "v:c")))
			page, err := s.Scan(t.Context(), "p", relaycore.ScanRequest{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			// Changes between pages are visible to later pages: the cursor is
			// a key, not a snapshot.
			mustApply(t, s, "p", writes(del("b"), put("bb", "v:bb")))
			rest := scanAll(t, s, "p", relaycore.ScanRequest{After: page.Next})
			got := append(page.Items, rest...)
			wantKeys(t, "paged scan across a write", got, []string{"a", "bb", "c"})
		}},
		{"Random", func(t *testing.T, s relaycore.Store) {
			seed := seedFor(t)
			rng := rand.New(rand.NewPCG(seed, 0x5ca7))
			alphabet := []string{"a", "b", "\x00", "\xff", "é", "0"}
			randKey := func() string {
				n := 1 + rng.IntN(4)
				k := ""
				for range n {
					k += alphabet[rng.IntN(len(alphabet))]
				}
				return k
			}
			set := map[string]bool{}
			for len(set) < 40 {
				set[randKey()] = true
			}
			var ws []relaycore.Write
			var sorted []string
			for k := range set {
				ws = append(ws, relaycore.Write{Key: k, Value: []byte("v:" + k)})
				sorted = append(sorted, k)
			}
			slices.Sort(sorted)
			mustApply(t, s, "p", relaycore.Batch{Writes: ws})
			for range 30 {
				req := relaycore.ScanRequest{Limit: rng.IntN(8)}
				if rng.IntN(2) == 0 {
					req.Start = randKey()
				}
				if rng.IntN(2) == 0 {
					req.End = randKey()
				}
				if rng.IntN(2) == 0 {
					req.After = randKey()
				}
				wantKeys(t, fmt.Sprintf("seed %d scan %s", seed, fmtReq(req)), scanAll(t, s, "p", req), expectScan(sorted, req))
			}
		}},
	}
}
