package storetest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// fullBatch builds a batch of exactly n distinct keys mixing the three
// shapes the engine uses: pure guards, guarded writes (precondition and
// write on one key, counted once) and plain writes.
func fullBatch(n int) relaycore.Batch {
	var b relaycore.Batch
	for i := range n {
		k := fmt.Sprintf("k%04d", i)
		switch i % 3 {
		case 0:
			b.Preconditions = append(b.Preconditions, absent(k))
		case 1:
			b.Preconditions = append(b.Preconditions, absent(k))
			b.Writes = append(b.Writes, put(k, "v"))
		default:
			b.Writes = append(b.Writes, put(k, "v"))
		}
	}
	return b
}

func limitCases() []suiteCase {
	return []suiteCase{
		{"MaxBatchItems", func(t *testing.T, s relaycore.Store) {
			caps := s.Capabilities()
			if caps.MaxBatchItems <= 0 {
				t.Skip("store reports no item limit")
			}
			mustApply(t, s, "p", writes(put("keep", "1")))
			before := snapshot(t, s, "p")
			over := fullBatch(caps.MaxBatchItems + 1)
			wantRefused(t, s.Apply(t.Context(), "p", over), relaycore.ErrBatchTooLarge)
			wantUnchanged(t, s, "p", before)

			full := fullBatch(caps.MaxBatchItems)
			mustApply(t, s, "p", full)
			if got := snapshot(t, s, "p"); len(got) != 1+len(full.Writes) {
				t.Fatalf("after a full batch: %d items, want %d", len(got), 1+len(full.Writes))
			}
		}},
		{"MaxItemBytes", func(t *testing.T, s relaycore.Store) {
			caps := s.Capabilities()
			if caps.MaxItemBytes <= 0 {
				t.Skip("store reports no item size limit")
			}
			const p, key = relaycore.Partition("p"), "big"
			fit := caps.MaxItemBytes - caps.ItemSize(p, key, 0)
			if fit < 0 {
				t.Fatalf("capabilities %+v leave no room for a value", caps)
			}
			mustApply(t, s, p, writes(put("keep", "1")))
			before := snapshot(t, s, p)
			tooBig := relaycore.Batch{Writes: []relaycore.Write{
				put("small", "x"),
				{Key: key, Value: bytes.Repeat([]byte{'b'}, fit+1)},
			}}
			wantRefused(t, s.Apply(t.Context(), p, tooBig), relaycore.ErrValueTooLarge)
			wantUnchanged(t, s, p, before)

			// Exactly at the limit fits: ItemOverhead must not under-count
			// what the backend itself charges.
			value := bytes.Repeat([]byte{'b'}, fit)
			mustApply(t, s, p, relaycore.Batch{Writes: []relaycore.Write{{Key: key, Value: value}}})
			if v, _ := mustGet(t, s, p, key); !bytes.Equal(v, value) {
				t.Fatalf("value at the item limit did not round-trip (%d bytes back, want %d)", len(v), len(value))
			}
		}},
		{"MaxBatchBytes", func(t *testing.T, s relaycore.Store) {
			caps := s.Capabilities()
			if caps.MaxBatchBytes <= 0 {
				t.Skip("store reports no batch byte limit")
			}
			p := relaycore.Partition("p")
			per := caps.MaxBatchBytes
			if caps.MaxItemBytes > 0 && caps.MaxItemBytes < per {
				per = caps.MaxItemBytes
			}
			valueLen := per - caps.ItemSize(p, "k0000", 0)
			n := caps.MaxBatchBytes/per + 1
			if caps.MaxBatchItems > 0 && n > caps.MaxBatchItems {
				t.Skipf("byte limit cannot be reached within %d items", caps.MaxBatchItems)
			}
			value := bytes.Repeat([]byte{'v'}, valueLen)
			var b relaycore.Batch
			for i := range n {
				b.Writes = append(b.Writes, relaycore.Write{Key: fmt.Sprintf("k%04d", i), Value: value})
			}
			mustApply(t, s, p, writes(put("keep", "1")))
			before := snapshot(t, s, p)
			wantRefused(t, s.Apply(t.Context(), p, b), relaycore.ErrBatchTooLarge)
			wantUnchanged(t, s, p, before)
		}},
		{"InvalidBatch", func(t *testing.T, s relaycore.Store) {
			mustApply(t, s, "p", writes(put("a", "1")))
			before := snapshot(t, s, "p")
			cases := []struct {
				name string
				p    relaycore.Partition
				b    relaycore.Batch
			}{
				{"Empty", "p", relaycore.Batch{}},
				{"EmptyNonNil", "p", relaycore.Batch{Preconditions: []relaycore.Precondition{}, Writes: []relaycore.Write{}}},
				{"PutTwice", "p", writes(put("b", "1"), put("b", "2"))},
				{"PutAndDelete", "p", writes(put("b", "1"), put("c", "1"), del("b"))},
				{"DeleteTwice", "p", writes(del("a"), del("a"))},
				{"EmptyWriteKey", "p", writes(put("b", "1"), put("", "1"))},
				{"EmptyPreconditionKey", "p", relaycore.Batch{Preconditions: []relaycore.Precondition{absent("")}, Writes: []relaycore.Write{put("b", "1")}}},
				{"EmptyPartition", "", writes(put("b", "1"))},
				{"PartitionTooLong", relaycore.Partition(strings.Repeat("p", relaycore.MaxPartitionLen+1)), writes(put("b", "1"))},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					wantRefused(t, s.Apply(t.Context(), c.p, c.b), relaycore.ErrInvalidBatch)
					wantUnchanged(t, s, "p", before)
					if c.p != "" && c.p != "p" {
						if got := snapshot(t, s, c.p); len(got) != 0 {
							t.Fatalf("refused batch wrote %s to %s", fmtItems(got), c.p)
						}
					}
				})
			}
		}},
		{"LongPartitionName", func(t *testing.T, s relaycore.Store) {
			p := relaycore.Partition(strings.Repeat("p", relaycore.MaxPartitionLen))
			mustApply(t, s, p, writes(put("k", "v")))
			wantValue(t, s, p, "k", "v")
			wantAbsent(t, s, p[:relaycore.MaxPartitionLen-1], "k")
		}},
	}
}
