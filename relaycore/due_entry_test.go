package relaycore_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// Compare sorts oldest first, then by partition, then by key, whatever
// order the entries came in.
func TestDueEntryCompare(t *testing.T) {
	want := []relaycore.DueEntry{
		{Partition: "b", Key: "alarm", Due: 5},
		{Partition: "a", Key: "alarm", Due: 7},
		{Partition: "a", Key: "z", Due: 7},
		{Partition: "b", Key: "a", Due: 7},
		{Partition: "a", Key: "alarm", Due: 9},
	}
	for i := range len(want) {
		got := append(slices.Clone(want[i:]), want[:i]...)
		slices.Reverse(got)
		slices.SortFunc(got, relaycore.DueEntry.Compare)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("rotation %d sorted:\n got  %v\n want %v", i, got, want)
		}
	}
	if c := want[1].Compare(want[1]); c != 0 {
		t.Fatalf("an entry compared with itself = %d", c)
	}
}
