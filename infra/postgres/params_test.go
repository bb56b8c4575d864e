package postgres

import (
	"encoding/binary"
	"hash/fnv"
	"reflect"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// TestLockKeysStable: the lock keys are the FNV-1a hashes hash/fnv gives
// of the length-prefixed (store, partition, key), as the releases before
// this one computed them, sorted and distinct, and one of them is pinned:
// replicas of different releases sharing a database during an upgrade
// must lock the same keys, or two batches on one key could run at once.
func TestLockKeysStable(t *testing.T) {
	ref := func(store string, p relaycore.Partition, b relaycore.Batch) []int64 {
		prefix := binary.AppendUvarint(nil, uint64(len(store)))
		prefix = append(prefix, store...)
		prefix = binary.AppendUvarint(prefix, uint64(len(p)))
		prefix = append(prefix, p...)
		var keys []int64
		for _, k := range append(pcKeys(b), writeKeys(b)...) {
			buf := binary.AppendUvarint(slices.Clone(prefix), uint64(len(k)))
			h := fnv.New64a()
			h.Write(append(buf, k...))
			keys = append(keys, int64(h.Sum64()))
		}
		slices.Sort(keys)
		return slices.Compact(keys)
	}
	long := string(make([]byte, 300)) // a length of two uvarint bytes
	b := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: "os", Value: []byte("1")}, {Key: "al", Absent: true}},
		Writes:        []relaycore.Write{{Key: "os", Value: []byte("2")}, {Key: "r/1"}, {Key: long, Delete: true}},
	}
	for _, c := range []struct {
		store string
		p     relaycore.Partition
	}{{"source", "orders"}, {"s", relaycore.Partition(long)}} {
		got, want := lockKeys(c.store, c.p, b), ref(c.store, c.p, b)
		if !slices.Equal(got, want) || len(got) != 4 {
			t.Fatalf("lock keys of %q/%.10q = %x; want %x (hash/fnv), four keys", c.store, c.p, got, want)
		}
		// Appending keeps what precedes.
		if got := appendLockKeys([]int64{7}, c.store, c.p, b); got[0] != 7 || !slices.Equal(got[1:], want) {
			t.Fatalf("appendLockKeys after 7 = %x; want 7 then %x", got, want)
		}
	}
	// Pinned: FNV-1a 64 of uvarint(6) "source" uvarint(6) "orders" uvarint(2) "os".
	if got := lockKeys("source", "orders", relaycore.Batch{Writes: []relaycore.Write{{Key: "os"}}}); len(got) != 1 || uint64(got[0]) != 0xf012de0ca44404e9 {
		t.Fatalf("lock key of source/orders/os = %x; want f012de0ca44404e9", got)
	}
}

func pcKeys(b relaycore.Batch) []string {
	var ks []string
	for _, pc := range b.Preconditions {
		ks = append(ks, pc.Key)
	}
	return ks
}

func writeKeys(b relaycore.Batch) []string {
	var ks []string
	for _, w := range b.Writes {
		ks = append(ks, w.Key)
	}
	return ks
}

// TestParamsDecode: the server decodes Apply's binary parameters into what
// the statements are written for (read back through pgx's own decoding):
// empty arrays for empty parts, nil and absent precondition values and nil
// put values as empty (not NULL) bytea, a missing due as 0, the lock keys
// as the bigints lockKeys gives. Also from a pooled buffer a bigger batch
// left behind.
func TestParamsDecode(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.NewDatabase(t), 1)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const echo = `SELECT $1::text, $2::bytea, $3::bytea[], $4::bytea[], $5::bool[], $6::bytea[], $7::bigint[], $8::bytea[], $9::bytea[], $10::bigint[]`
	oids := append(slices.Clone(applyParamOIDs), lockParamOIDs...)
	m := pgtype.NewMap()
	type decoded struct {
		Store            string
		Part             []byte
		PcKeys, PcVals   [][]byte
		PcAbsent         []bool
		PutKeys          [][]byte
		PutDue           []int64
		PutVals, DelKeys [][]byte
		Locks            []int64
	}
	big := relaycore.Batch{}
	for i := range 200 {
		big.Writes = append(big.Writes, relaycore.Write{Key: string(rune('a'+i%26)) + string(rune('0'+i/26)), Value: make([]byte, 100)})
	}
	e := getParams()
	e.encodeApply("x", "y", big)
	for _, c := range []struct {
		name string
		b    relaycore.Batch
		want decoded
	}{
		{"empty", relaycore.Batch{}, decoded{Store: "store", Part: []byte("part"), PcKeys: [][]byte{}, PcVals: [][]byte{}, PcAbsent: []bool{},
			PutKeys: [][]byte{}, PutDue: []int64{}, PutVals: [][]byte{}, DelKeys: [][]byte{}, Locks: []int64{}}},
		{"every part", relaycore.Batch{
			Preconditions: []relaycore.Precondition{{Key: "os", Value: []byte("v1")}, {Key: "al", Absent: true, Value: []byte("ignored")}, {Key: "nil"}},
			Writes: []relaycore.Write{{Key: "os", Value: []byte("v2")}, {Key: "al", Value: []byte("a"), Due: 1 << 40}, {Key: "gone", Delete: true},
				{Key: "r/1"}, {Key: "gone2", Delete: true, Value: []byte("ignored")}},
		}, decoded{Store: "store", Part: []byte("part"),
			PcKeys: [][]byte{[]byte("os"), []byte("al"), []byte("nil")}, PcVals: [][]byte{[]byte("v1"), {}, {}}, PcAbsent: []bool{false, true, false},
			PutKeys: [][]byte{[]byte("os"), []byte("al"), []byte("r/1")}, PutDue: []int64{0, 1 << 40, 0}, PutVals: [][]byte{[]byte("v2"), []byte("a"), {}},
			DelKeys: [][]byte{[]byte("gone"), []byte("gone2")}}},
	} {
		e.encodeApply("store", "part", c.b)
		want := c.want
		if want.Locks == nil {
			want.Locks = lockKeys("store", "part", c.b)
		}
		res := conn.Conn().PgConn().ExecParams(ctx, echo, append(e.apply[:], e.lock[:]...), oids, binaryFormat, binaryFormat).Read()
		if res.Err != nil || len(res.Rows) != 1 {
			t.Fatalf("%s: %d rows, %v", c.name, len(res.Rows), res.Err)
		}
		var got decoded
		dst := []any{&got.Store, &got.Part, &got.PcKeys, &got.PcVals, &got.PcAbsent, &got.PutKeys, &got.PutDue, &got.PutVals, &got.DelKeys, &got.Locks}
		for i, v := range res.Rows[0] {
			if err := m.Scan(oids[i], pgtype.BinaryFormatCode, v, dst[i]); err != nil {
				t.Fatalf("%s: column %d: %v", c.name, i+1, err)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: the server decoded\n%+v\nwant\n%+v", c.name, got, want)
		}
	}
	e.release()
}
