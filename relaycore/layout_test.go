package relaycore

import "testing"

func TestPageKeyOrderIsSeqOrder(t *testing.T) {
	keys := []string{KeyAlarm, KeyLease, KeyOS, PageKey(1), PageKey(255), PageKey(1 << 40), pageEnd, KeyRS}
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
	got := TransactWriteUnits(caps, "src", b, func(k string) int {
		if k == "r/0" {
			return 3000
		}
		return 0
	})
	if want := 2 + 16 + 6 + 2; got != want { // + ConditionCheck on lease
		t.Fatalf("units = %d, want %d", got, want)
	}
}
