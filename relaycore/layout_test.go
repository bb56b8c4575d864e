package relaycore

import (
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

func TestPageKeyOrderIsSeqOrder(t *testing.T) {
	keys := []string{KeyAlarm, layout.KeyLease, KeyOS, layout.PageKey(1), layout.PageKey(255), layout.PageKey(1 << 40), layout.PageEnd, KeyRS}
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			t.Fatalf("%q sorts after %q", keys[i-1], keys[i])
		}
	}
}

func TestTransactWriteUnits(t *testing.T) {
	caps := Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 32}
	b := Batch{
		Preconditions: []Precondition{{Key: "os", Value: []byte("x")}, {Key: "lease", Value: []byte("y")}},
		Writes: []Write{
			{Key: "os", Value: make([]byte, 100)},   // 1 KB -> 2
			{Key: "r/1", Value: make([]byte, 7800)}, // 8 KB -> 16
			{Key: "r/0", Delete: true},              // existing 3000 B -> 3 KB -> 6
		},
	}
	got := transactWriteUnits(caps, "src", b, func(k string) int {
		if k == "r/0" {
			return 3000
		}
		return 0
	})
	if want := 2 + 16 + 6 + 2; got != want { // + ConditionCheck on lease
		t.Fatalf("units = %d, want %d", got, want)
	}
}

// The checkpoint reserves rsMaxBytes for rs: a full blocked set of the
// longest names at their worst encoding, with every scalar field at its
// widest, must fit it.
func TestRSMaxBytesBoundsWorstRS(t *testing.T) {
	for _, fill := range []byte{0x01, 0xff, '<', 'a'} {
		rs := RelayState{Version: ^uint64(0), CycleEnd: ^uint64(0), Cursor: ^uint64(0) - 1, From: layout.PageKey(^uint64(0)),
			Idle: int(^uint(0) >> 1), Claim: &Claim{Owner: "0123456789ab", UntilMS: -1 << 63}, SweptMS: -1 << 63,
			SweepAfter: "t/" + strings.Repeat("ff", MaxPartitionLen) + "/~"}
		for i := 0; i < MaxBlockedTargets; i++ {
			name := make([]byte, MaxPartitionLen)
			for j := range name {
				name[j] = fill
			}
			name[0] = byte(i)
			rs.Blocked = append(rs.Blocked, Partition(name))
		}
		if n := len(encodeJSON(rs)); n > rsMaxBytes {
			t.Fatalf("rs of %#x names is %d bytes, rsMaxBytes %d", fill, n, rsMaxBytes)
		}
	}
}

// os and rs keep room for their folded entries at foldBytes' worst-case
// sizes: entries added until the room refuses, each number at its widest,
// encode within it, for names short and long, on every step of the room.
func TestFoldedEntriesFitTheirRoom(t *testing.T) {
	for _, batch := range []int{0, 24 << 10, 64 << 10, 256 << 10, 4 << 20} {
		caps := Capabilities{MaxBatchBytes: batch}
		for _, nameLen := range []int{1, 9, MaxPartitionLen} {
			var done []foldedDone
			var enq []foldedEnq
			wide := targetEnq{N: ^uint64(0), Dropped: true}
			for range maxEnqRuns {
				wide.Runs = append(wide.Runs, [3]int64{-1 << 63, -1 << 63, -1 << 63})
			}
			for i := 0; ; i++ {
				name := make([]byte, nameLen)
				name[0] = byte(i)
				r := targetRec{Target: Partition(name), State: StateActive, Done: ^uint64(0), Through: ^uint64(0), Next: ^uint64(0), NextMS: -1 << 63}
				d, okD := foldDone(done, r, caps)
				e, okE := withEnq(enq, Partition(name), wide, caps)
				done, enq = d, e
				if !okD && !okE {
					break
				}
				if i > 2*maxFolded {
					t.Fatal("the room never refuses")
				}
			}
			hexLen := 2 * nameLen
			if n := len(encodeJSON(done)); n > foldBytes(caps) || len(done) > maxFolded || (len(done) == 0) != (hexLen+foldedDoneOverhead > foldBytes(caps)) {
				t.Fatalf("batch %d, names of %d: %d rs entries encode to %d bytes, room %d", batch, nameLen, len(done), n, foldBytes(caps))
			}
			if n := len(encodeJSON(enq)); n > osFoldBytes(caps) || len(enq) > maxFolded || (len(enq) == 0) != (hexLen+foldedEnqOverhead > osFoldBytes(caps)) {
				t.Fatalf("batch %d, names of %d: %d os entries encode to %d bytes, room %d", batch, nameLen, len(enq), n, osFoldBytes(caps))
			}
		}
	}
}
