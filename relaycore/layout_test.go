package relaycore

import (
	"bytes"
	"testing"
)

func TestPageRoundTrip(t *testing.T) {
	p := Page{Key: PageKey(7), First: 7, CommitMS: 1_800_000_000_123, Tag: "abc.0", Target: "tgt",
		Rows: []Row{
			{Puts: []KV{{Key: "a", Value: []byte("1")}, {Key: "b", Value: nil}}, Deletes: []string{"c"}},
			{Deletes: []string{"a"}},
		}}
	raw := encodePage(p)
	got, err := DecodePage(p.Key, raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.First != 7 || got.Last() != 8 || got.Tag != "abc.0" || got.Target != "tgt" || got.CommitMS != p.CommitMS {
		t.Fatalf("header %+v", got)
	}
	if got.Rows[1].Seq != 8 || got.Rows[1].Target != "tgt" || got.Rows[0].Deletes[0] != "c" || string(got.Rows[0].Puts[0].Value) != "1" {
		t.Fatalf("rows %+v", got.Rows)
	}
	if !bytes.Equal(encodePage(got), raw) {
		t.Fatal("re-encoding differs")
	}
	for i := 0; i < len(raw); i++ {
		if _, err := DecodePage("k", raw[:i]); err == nil {
			t.Fatalf("truncation at %d decoded", i)
		}
	}
}

func TestPageKeyOrderIsSeqOrder(t *testing.T) {
	keys := []string{KeyAlarm, KeyLease, KeyOS, PageKey(1), PageKey(255), PageKey(1 << 40), pageEnd, KeyRS}
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			t.Fatalf("%q sorts after %q", keys[i-1], keys[i])
		}
	}
}

// A 200-byte row must cost about 205 bytes in a page: the target is stored
// once per page, lengths are varints.
func TestRowEncodingIsCompact(t *testing.T) {
	r := Row{Puts: []KV{{Key: "user/000123/profile", Value: bytes.Repeat([]byte("x"), 181)}}}
	if n := rowEncodedLen(r); n > 205 {
		t.Fatalf("200-byte row encodes to %d bytes", n)
	}
}

func FuzzDecodePage(f *testing.F) {
	f.Add(encodePage(Page{First: 1, CommitMS: 5, Tag: "t", Target: "x", Rows: []Row{{Puts: []KV{{Key: "k", Value: []byte("v")}}}}}))
	f.Add(encodePage(Page{First: 1 << 60, Tag: "", Target: "y", Rows: []Row{{Deletes: []string{"a", "b"}}, {Puts: []KV{{Key: "c"}}}}}))
	f.Add([]byte{1, 0x80})
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := DecodePage("k", raw)
		if err != nil {
			return
		}
		again, err := DecodePage("k", encodePage(p))
		if err != nil || again.First != p.First || len(again.Rows) != len(p.Rows) {
			t.Fatalf("decoded page does not round-trip: %v", err)
		}
	})
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
