package bench

import (
	"bytes"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// The meter prices what infra/dynamo sends for each batch: a transaction
// at 2 units per started KB of each item, a batch on one key at 1 (a
// refused one by the existing item), a precondition-only batch on one key
// as a read, loose deletes at 1 per started KB of each deleted item. The
// figures are worked out by hand (sizes: p, k, v names plus values).
func TestMeterPricesWhatIsSent(t *testing.T) {
	m, _ := dynamoStores(t)
	ctx := t.Context()
	v1000, v1500 := bytes.Repeat([]byte{1}, 1000), bytes.Repeat([]byte{1}, 1500)
	absent := func(k string) relaycore.Precondition { return relaycore.Precondition{Key: k, Absent: true} }
	is := func(k string, v []byte) relaycore.Precondition { return relaycore.Precondition{Key: k, Value: v} }
	put := func(k string, v []byte) relaycore.Write { return relaycore.Write{Key: k, Value: v} }
	for _, c := range []struct {
		name         string
		b            *relaycore.Batch // nil: DeleteLoose of loose
		loose        []string
		refused      bool
		write, reads float64
		calls        int
	}{
		// s: 1+9 + 1+1 + 1+1000 = 1013 B -> 1 KB, once.
		{"single create", &relaycore.Batch{Preconditions: []relaycore.Precondition{absent("s")}, Writes: []relaycore.Write{put("s", v1000)}}, nil, false, 1, 0, 1},
		// a: 1013 B -> 2; b: 1513 B -> 4; both twice.
		{"transaction", &relaycore.Batch{Preconditions: []relaycore.Precondition{absent("a")}, Writes: []relaycore.Write{put("a", v1000), put("b", v1500)}}, nil, false, 6, 0, 1},
		// max(1013, 1513) B -> 2 KB, once.
		{"single compare and swap", &relaycore.Batch{Preconditions: []relaycore.Precondition{is("s", v1000)}, Writes: []relaycore.Write{put("s", v1500)}}, nil, false, 2, 0, 1},
		// Refused: billed by the existing 1513 B.
		{"single refused", &relaycore.Batch{Preconditions: []relaycore.Precondition{is("s", v1000)}, Writes: []relaycore.Write{put("s", v1000)}}, nil, true, 2, 0, 1},
		// A GetItem of 1513 B.
		{"single check", &relaycore.Batch{Preconditions: []relaycore.Precondition{is("s", v1500)}}, nil, false, 0, 1, 1},
		// A refused transaction is not priced.
		{"transaction refused", &relaycore.Batch{Preconditions: []relaycore.Precondition{absent("a")}, Writes: []relaycore.Write{put("c", v1000)}}, nil, true, 0, 0, 1},
		// a 1 KB, b 2 KB, an absent key 1, s 2 KB; 30 distinct keys
		// with the other 26 absent: two requests.
		{"loose deletes", nil, append([]string{"a", "b", "a", "absent", "s"}, manyKeys(26)...), false, 1 + 2 + 1 + 2 + 26, 0, 2},
		{"loose delete again", nil, []string{"a"}, false, 1, 0, 1},
	} {
		w0, r0, c0 := m.WriteUnits, m.ReadUnits, m.Calls
		var err error
		if c.b != nil {
			err = m.Apply(ctx, "src-meter", *c.b)
		} else {
			err = m.DeleteLoose(ctx, "src-meter", c.loose)
		}
		if _, refused := relaycore.FailedPrecondition(err); refused != c.refused || (err != nil && !refused) {
			t.Fatalf("%s: %v", c.name, err)
		}
		if w, r, n := m.WriteUnits-w0, m.ReadUnits-r0, m.Calls-c0; w != c.write || r != c.reads || n != c.calls {
			t.Errorf("%s: %v write units, %v read units, %d calls; want %v, %v, %d", c.name, w, r, n, c.write, c.reads, c.calls)
		}
	}
}

func manyKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = string(rune('A'+i%26)) + "/more"
	}
	return keys
}
