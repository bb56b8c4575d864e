package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
)

// checkLayout verifies the invariants of the file layout (doc.go) that
// the contract's answers rest on, for every table in the file:
//
//  1. a table bucket holds only the part, due and dueof buckets;
//  2. no partition bucket is empty (emptied partitions are dropped);
//  3. due and dueof are mirror images: each due key <t><ref> has dueof
//     <ref> = <t>, and the other way round (one entry per item);
//  4. every indexed item exists in its partition.
func checkLayout(db *DB) error {
	var errs []error
	err := db.bolt.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(table []byte, tb *bbolt.Bucket) error {
			bad := func(format string, args ...any) {
				errs = append(errs, fmt.Errorf("table %q: "+format, append([]any{table}, args...)...))
			}
			_ = tb.ForEach(func(k, v []byte) error {
				if v != nil || !slices.ContainsFunc([][]byte{partsBucket, dueBucket, dueOfBucket}, func(n []byte) bool { return bytes.Equal(n, k) }) {
					bad("unexpected entry %q", k)
				}
				return nil
			})
			parts, due, dueOf := tb.Bucket(partsBucket), tb.Bucket(dueBucket), tb.Bucket(dueOfBucket)
			if parts == nil || due == nil || dueOf == nil {
				bad("missing one of part, due, dueof")
				return nil
			}
			_ = parts.ForEachBucket(func(p []byte) error {
				if k, _ := parts.Bucket(p).Cursor().First(); k == nil {
					bad("empty partition bucket %q", p)
				}
				return nil
			})
			n := 0
			_ = due.ForEach(func(k, _ []byte) error {
				n++
				if len(k) < dueKeyPrefix {
					bad("short due key %x", k)
					return nil
				}
				ref := k[8:]
				if got := dueOf.Get(ref); !bytes.Equal(got, k[:8]) {
					bad("due entry %x: dueof holds %x", k, got)
				}
				p, key, ok := decodeItemRef(ref)
				if !ok {
					bad("malformed item reference %x", ref)
					return nil
				}
				pb := parts.Bucket([]byte(p))
				if _, found := lookup(pb, key); !found {
					bad("due entry for missing item %s/%q", p, key)
				}
				return nil
			})
			if m := dueOf.Stats().KeyN; m != n {
				bad("%d due entries but %d dueof entries", n, m)
			}
			return nil
		})
	})
	return errors.Join(err, errors.Join(errs...))
}

func TestDueEncodingOrder(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	times := []int64{math.MinInt64, -1 << 40, -2, -1, 1, 2, 255, 256, 1_764_000_000_000, math.MaxInt64}
	for range 200 {
		times = append(times, int64(rng.Uint64()))
	}
	for _, a := range times {
		if got := decodeDue(encodeDue(a)); got != a {
			t.Fatalf("decode(encode(%d)) = %d", a, got)
		}
		for _, b := range times[:20] {
			if c := bytes.Compare(encodeDue(a), encodeDue(b)); c != cmpInt(a, b) {
				t.Fatalf("encoded %d vs %d compares %d, want %d (seed %d)", a, b, c, cmpInt(a, b), seed)
			}
		}
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestItemRefRoundTrip(t *testing.T) {
	for _, c := range []struct {
		p   relaycore.Partition
		key string
	}{{"a", "bc"}, {"ab", "c"}, {"p", ""}, {relaycore.Partition(bytes.Repeat([]byte{0xff}, 255)), "\x00"}} {
		p, key, ok := decodeItemRef(itemRef(c.p, c.key))
		if !ok || p != c.p || key != c.key {
			t.Fatalf("round trip of (%q, %q) = (%q, %q, %v)", c.p, c.key, p, key, ok)
		}
	}
	if !bytes.Equal(itemRef("a", "bc"), itemRef("a", "bc")) || bytes.Equal(itemRef("a", "bc"), itemRef("ab", "c")) {
		t.Fatal("item references of different items collide")
	}
	if _, _, ok := decodeItemRef([]byte{5, 'a'}); ok {
		t.Fatal("truncated reference decoded")
	}
}

// TestCheckLayoutCatchesDrift proves checkLayout can fail: it breaks each
// invariant by hand and expects a complaint.
func TestCheckLayoutCatchesDrift(t *testing.T) {
	breakers := map[string]func(tb *bbolt.Bucket) error{
		"orphan due entry": func(tb *bbolt.Bucket) error {
			return tb.Bucket(dueBucket).Put(dueKey(7, itemRef("p", "ghost")), nil)
		},
		"stale dueof": func(tb *bbolt.Bucket) error {
			return tb.Bucket(dueOfBucket).Put(itemRef("p", "alarm"), encodeDue(99))
		},
		"item gone": func(tb *bbolt.Bucket) error {
			return tb.Bucket(partsBucket).Bucket([]byte("p")).Delete([]byte("alarm"))
		},
		"empty partition": func(tb *bbolt.Bucket) error {
			_, err := tb.Bucket(partsBucket).CreateBucket([]byte("empty"))
			return err
		},
	}
	for name, breakIt := range breakers {
		t.Run(name, func(t *testing.T) {
			db, err := Open(t.TempDir()+"/relay.db", Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			s := db.Store("relay")
			if err := s.Apply(t.Context(), "p", relaycore.Batch{Writes: []relaycore.Write{
				{Key: "alarm", Value: []byte("a"), Due: 5}, {Key: "other", Value: []byte("o")},
			}}); err != nil {
				t.Fatal(err)
			}
			if err := checkLayout(db); err != nil {
				t.Fatalf("before breaking: %v", err)
			}
			if err := db.bolt.Update(func(tx *bbolt.Tx) error { return breakIt(tx.Bucket([]byte("relay"))) }); err != nil {
				t.Fatal(err)
			}
			if err := checkLayout(db); err == nil {
				t.Fatal("checkLayout found nothing wrong")
			} else {
				t.Log(err)
			}
		})
	}
}
