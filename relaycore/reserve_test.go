package relaycore

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// checkpointReserveDirect is CheckpointReserve as first written: every
// item's size with the source in it.
func checkpointReserveDirect(source Partition, caps Capabilities) int {
	long := Partition(strings.Repeat("x", MaxPartitionLen))
	return caps.ItemSize(source, KeyRS, rsBound(caps)) + caps.ItemSize(source, layout.KeyHold, holdMaxBytes) +
		caps.ItemSize(source, targetStateKey(long), targetRecMaxBytes) + 2*caps.ItemSize(source, retryKey(0, long), 0) +
		caps.ItemSize(source, heldPageKey(long, 0), 0) + caps.ItemSize(source, layout.PageKey(0), 0)
}

// The memoized CheckpointReserve equals the item-by-item sum for any
// source and capabilities (wide non-ASCII bytes included), and costs no
// allocation once its capabilities were seen.
func TestCheckpointReserveMemoized(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		caps := Capabilities{MaxBatchItems: rng.IntN(200), MaxBatchBytes: rng.IntN(8 << 20), MaxItemBytes: rng.IntN(1 << 20),
			ItemOverhead: rng.IntN(200), WideNonASCII: rng.IntN(2) == 0}
		b := make([]byte, 1+rng.IntN(MaxPartitionLen))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		src := Partition(b)
		if got, want := CheckpointReserve(src, caps), checkpointReserveDirect(src, caps); got != want {
			t.Fatalf("CheckpointReserve(%q, %+v) = %d, want %d", src, caps, got, want)
		}
	}
	caps := Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 100}
	if n := testing.AllocsPerRun(100, func() { CheckpointReserve("orders", caps) }); n != 0 {
		t.Errorf("CheckpointReserve allocates %.0f times a call, want 0", n)
	}
}

// BenchmarkCheckpointReserve: the memoized reserve against the
// item-by-item sum it replaced, per call (enqueue makes one per row).
func BenchmarkCheckpointReserve(b *testing.B) {
	caps := Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 100}
	b.Run("direct", func(b *testing.B) {
		for range b.N {
			checkpointReserveDirect("orders", caps)
		}
	})
	b.Run("memoized", func(b *testing.B) {
		for range b.N {
			CheckpointReserve("orders", caps)
		}
	})
}
