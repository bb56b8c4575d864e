package segstore

import (
	"slices"
	"testing"
)

// TestListAfterPages: pages of ListAfter walk the index in id order, each
// starting after the id given (stored or not), and together are List.
func TestListAfterPages(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 1 << 20, QuotaSegments: 100, MaxSegmentBytes: 1 << 10})
	ids := []string{"a", "b", "c", "d", "e"}
	for i, id := range ids {
		put(t, f.s, id, content(10, byte(i)))
	}
	pages := func(limit int) [][]string {
		var out [][]string
		for after := ""; ; {
			es, err := f.s.ListAfter(after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) == 0 {
				return out
			}
			var page []string
			for _, e := range es {
				page = append(page, e.ID)
			}
			out = append(out, page)
			after = page[len(page)-1]
		}
	}
	if got := pages(2); !slices.EqualFunc(got, [][]string{{"a", "b"}, {"c", "d"}, {"e"}}, slices.Equal) {
		t.Fatalf("pages of 2: %v", got)
	}
	if got := pages(10); len(got) != 1 || !slices.Equal(got[0], ids) {
		t.Fatalf("one page: %v", got)
	}
	es, err := f.s.ListAfter("bb", 2) // not stored: starts at the next id
	if err != nil || len(es) != 2 || es[0].ID != "c" || es[1].ID != "d" {
		t.Fatalf("after a missing id: %v %v", es, err)
	}
	if es, err := f.s.ListAfter("e", 2); err != nil || len(es) != 0 {
		t.Fatalf("after the last id: %v %v", es, err)
	}
}
