package relaycore

import (
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
			Idle: int(^uint(0) >> 1), Claim: &Claim{Owner: "0123456789ab", UntilMS: -1 << 63}}
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
