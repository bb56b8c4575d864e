package storetest

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func modelCases() []suiteCase {
	return []suiteCase{{"RandomBatches", randomBatches}}
}

// model is the reference semantics of the contract, written as plainly as
// possible: a map per partition and a due map.
type model struct {
	parts map[relaycore.Partition]map[string][]byte
	due   map[relaycore.DueEntry]bool
}

// holds reports whether pc is true in partition p.
func (m *model) holds(p relaycore.Partition, pc relaycore.Precondition) bool {
	v, ok := m.parts[p][pc.Key]
	if pc.Absent {
		return !ok
	}
	return ok && bytes.Equal(v, pc.Value)
}

func (m *model) apply(p relaycore.Partition, b relaycore.Batch) {
	if m.parts[p] == nil {
		m.parts[p] = map[string][]byte{}
	}
	for _, w := range b.Writes {
		for e := range m.due {
			if e.Partition == p && e.Key == w.Key {
				delete(m.due, e)
			}
		}
		if w.Delete {
			delete(m.parts[p], w.Key)
			continue
		}
		m.parts[p][w.Key] = bytes.Clone(w.Value)
		if w.Due != 0 {
			m.due[relaycore.DueEntry{Partition: p, Key: w.Key, Due: w.Due}] = true
		}
	}
}

// randomBatches applies a seeded random sequence of batches (guards that
// hold or not, puts, deletes, due times, two partitions) and compares the
// store with the model after every batch: the outcome, every partition's
// full content, and the due index.
func randomBatches(t *testing.T, s relaycore.Store) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x30de1))
	parts := []relaycore.Partition{"m1", "m2"}
	keys := []string{"k0", "k1", "k2", "k3", "k\x00", "k\xff", "kk", "é"}
	values := [][]byte{nil, []byte("a"), []byte("b"), []byte("ab"), {0, 0xff}}
	m := &model{parts: map[relaycore.Partition]map[string][]byte{}, due: map[relaycore.DueEntry]bool{}}
	d, hasDue := s.(relaycore.DueIndex)

	for step := range 120 {
		p := parts[rng.IntN(len(parts))]
		var b relaycore.Batch
		for range rng.IntN(3) {
			k := keys[rng.IntN(len(keys))]
			pc := relaycore.Precondition{Key: k}
			switch cur, ok := m.parts[p][k]; {
			case rng.IntN(3) == 0:
				pc.Absent = true
			case ok && rng.IntN(3) > 0:
				pc.Value = bytes.Clone(cur) // usually holds
			default:
				pc.Value = values[rng.IntN(len(values))]
			}
			b.Preconditions = append(b.Preconditions, pc)
		}
		for _, i := range rng.Perm(len(keys))[:rng.IntN(4)] {
			w := relaycore.Write{Key: keys[i]}
			switch rng.IntN(4) {
			case 0:
				w.Delete = true
			case 1:
				w.Due = 1 + rng.Int64N(50)
				fallthrough
			default:
				w.Value = values[rng.IntN(len(values))]
			}
			b.Writes = append(b.Writes, w)
		}
		if len(b.Preconditions)+len(b.Writes) == 0 {
			b.Writes = append(b.Writes, put(keys[0], "filler"))
		}
		what := fmt.Sprintf("seed %d step %d: apply %s %s", seed, step, p, fmtBatch(b))

		var falseIdx []int
		for i, pc := range b.Preconditions {
			if !m.holds(p, pc) {
				falseIdx = append(falseIdx, i)
			}
		}
		err := s.Apply(t.Context(), p, b)
		switch {
		case len(falseIdx) == 0 && err != nil:
			t.Fatalf("%s: %v; the model applies it", what, err)
		case len(falseIdx) == 0:
			m.apply(p, b)
		default:
			i, ok := relaycore.FailedPrecondition(err)
			if !ok || !slices.Contains(falseIdx, i) {
				t.Fatalf("%s = %v; want a ConditionFailedError naming one of %v", what, err, falseIdx)
			}
		}

		for _, q := range parts {
			got := scanAll(t, s, q, relaycore.ScanRequest{Limit: rng.IntN(4)})
			var want []relaycore.Item
			for _, k := range slices.Sorted(maps.Keys(m.parts[q])) {
				want = append(want, relaycore.Item{Key: k, Value: m.parts[q][k]})
			}
			if !sameItems(got, want) {
				t.Fatalf("%s: partition %s\n got  %s\n want %s", what, q, fmtItems(got), fmtItems(want))
			}
		}
		if hasDue {
			got, err := d.Due(t.Context(), 1<<62, 1000)
			if err != nil {
				t.Fatalf("%s: due: %v", what, err)
			}
			if !slices.IsSortedFunc(got, func(a, b relaycore.DueEntry) int { return cmp.Compare(a.Due, b.Due) }) {
				t.Fatalf("%s: due not oldest first: %v", what, got)
			}
			byAll := func(a, b relaycore.DueEntry) int {
				return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Key, b.Key))
			}
			slices.SortFunc(got, byAll)
			want := slices.SortedFunc(maps.Keys(m.due), byAll)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: due index\n got  %v\n want %v", what, got, want)
			}
		}
	}
}
