package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// sealer is a Seal that records its calls; its receipt names the request
// and the tombstone, and it writes a marker key in the transaction so a
// test can see that its writes commit or roll back with the takedown.
type sealer struct {
	calls int
	fail  error
}

var markBucket = []byte("test.marks")

func (sl *sealer) seal(tx *bolt.Tx, t Tombstone, request string) ([]byte, error) {
	sl.calls++
	if sl.fail != nil {
		return nil, sl.fail
	}
	b, err := tx.CreateBucketIfNotExists(markBucket)
	if err != nil {
		return nil, err
	}
	if err := b.Put([]byte(t.ID+"/"+request), []byte("x")); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "receipt %s %s %s %d", request, t.ID, t.SHA256, t.EvictedAt.UnixNano()), nil
}

func marked(t *testing.T, db *bolt.DB, key string) bool {
	t.Helper()
	var ok bool
	db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(markBucket)
		ok = b != nil && b.Get([]byte(key)) != nil
		return nil
	})
	return ok
}

func TestTakedown(t *testing.T) {
	for _, l := range []struct {
		name string
		open func(*testing.T, string, Options) *fixture
		opt  Options
		size int
	}{
		{"file", newStore, testOpts, 70_000},
		{"packed", newPackStore, packModes[0].opts, 3_000},
	} {
		t.Run(l.name, func(t *testing.T) {
			f := l.open(t, "", l.opt)
			b := content(l.size, 7)
			e := put(t, f.s, "s", b)
			put(t, f.s, "keep", content(100, 1))
			before := f.s.Usage()
			sl := &sealer{}

			// A seal that fails aborts everything: the segment stays.
			bad := &sealer{fail: errors.New("no key")}
			if _, err := f.s.Takedown("s", "r1", bad.seal); err == nil || !bytes.Equal(read(t, f.s, "s"), b) {
				t.Fatalf("failed seal: %v", err)
			}
			if _, err := f.s.TombstoneOf("s"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("tombstone after a failed seal: %v", err)
			}

			res, err := f.s.Takedown("s", "r1", sl.seal)
			if err != nil || !res.Evicted || !res.Sealed || sl.calls != 1 {
				t.Fatalf("takedown: %+v %v (seal calls %d)", res, err, sl.calls)
			}
			if res.Tombstone.SHA256 != e.SHA256 || res.Tombstone.Size != e.Size || res.Tombstone.Request != "r1" {
				t.Fatalf("tombstone %+v of entry %+v", res.Tombstone, e)
			}
			if !marked(t, f.db, "s/r1") {
				t.Fatal("seal's write did not commit with the takedown")
			}
			if _, err := f.s.Stat("s"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("still indexed: %v", err)
			}
			if u := f.s.Usage(); u.Bytes != before.Bytes-e.Size || u.Segments != before.Segments-1 {
				t.Fatalf("usage %+v after, %+v before", u, before)
			}
			for _, src := range []string{"", "peer"} {
				if _, err := f.s.ReserveFrom(src, "s", e.Size, e.SHA256); !errors.Is(err, ErrEvicted) {
					t.Fatalf("reserve from %q after takedown: %v", src, err)
				}
			}

			// The same request again: the same receipt, nothing signed.
			again, err := f.s.Takedown("s", "r1", sl.seal)
			if err != nil || again.Evicted || again.Sealed || !bytes.Equal(again.Receipt, res.Receipt) || sl.calls != 1 {
				t.Fatalf("again: %+v %v", again, err)
			}
			// Another request: its own receipt, for the same tombstone.
			other, err := f.s.Takedown("s", "r2", sl.seal)
			if err != nil || other.Evicted || !other.Sealed || !other.Tombstone.EvictedAt.Equal(res.Tombstone.EvictedAt) || other.Tombstone.Request != "r1" || !marked(t, f.db, "s/r2") {
				t.Fatalf("other request: %+v %v", other, err)
			}
			// Never held: no receipt.
			if _, err := f.s.Takedown("never", "r1", sl.seal); !errors.Is(err, ErrNotFound) || sl.calls != 2 {
				t.Fatalf("unknown segment: %v (seal calls %d)", err, sl.calls)
			}
			rs, err := f.s.Receipts("")
			if err != nil || len(rs) != 2 || rs[0].Request != "r1" || rs[1].Request != "r2" || !bytes.Equal(rs[0].Receipt, res.Receipt) {
				t.Fatalf("receipts %+v %v", rs, err)
			}

			// After a restart the tombstone still refuses the segment.
			must(t, f.db.Close())
			db, err := bolt.Open(filepath.Join(f.dir, "edged.db"), 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			f.db = db
			if f.s, err = Open(f.dir, db, l.opt); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s.Reserve("s", e.Size, e.SHA256); !errors.Is(err, ErrEvicted) {
				t.Fatalf("reserve after restart: %v", err)
			}
			if _, err := f.s.Write("s", int64(len(b)), e.SHA256, bytes.NewReader(b), ""); !errors.Is(err, ErrEvicted) {
				t.Fatalf("write after restart: %v", err)
			}
			if !bytes.Equal(read(t, f.s, "keep"), content(100, 1)) {
				t.Fatal("other segment damaged")
			}
		})
	}
}

// A delivery that has the segment open when it is taken down does not
// hand over its last bytes: no peer gets a whole copy after the takedown.
func TestTakedownCutsOpenReader(t *testing.T) {
	for _, l := range []struct {
		name string
		open func(*testing.T, string, Options) *fixture
		opt  Options
		size int
	}{
		{"file", newStore, testOpts, 70_000},
		{"packed", newPackStore, packModes[0].opts, 3_000},
	} {
		t.Run(l.name, func(t *testing.T) {
			f := l.open(t, "", l.opt)
			b := content(l.size, 9)
			put(t, f.s, "s", b)
			r, _, err := f.s.Open("s")
			if err != nil {
				t.Fatal(err)
			}
			head := make([]byte, 100)
			if _, err := r.Read(head); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s.Takedown("s", "r1", (&sealer{}).seal); err != nil {
				t.Fatal(err)
			}
			var rest bytes.Buffer
			_, err = rest.ReadFrom(r)
			r.Close()
			if !errors.Is(err, ErrEvicted) || 100+rest.Len() >= len(b) {
				t.Fatalf("read after takedown: %d of %d bytes, err %v", 100+rest.Len(), len(b), err)
			}
		})
	}
}

// A crash right after the takedown's commit, before the file or record is
// removed: the next Open removes the orphan, and the tombstone and receipt
// are there.
func TestTakedownCrash(t *testing.T) {
	for _, l := range []struct {
		name string
		open func(*testing.T, string, Options) *fixture
		opt  Options
		size int
	}{
		{"file", newStore, testOpts, 70_000},
		{"packed", newPackStore, packModes[0].opts, 3_000},
	} {
		t.Run(l.name, func(t *testing.T) {
			f := l.open(t, "", l.opt)
			b := content(l.size, 4)
			e := put(t, f.s, "s", b)
			put(t, f.s, "keep", content(100, 2))
			snap := t.TempDir()
			f.s.fault = func(st step) error {
				if st == stepUnindex {
					snapshot(t, f, snap) // kill -9 here: what the disk holds
				}
				return nil
			}
			res, err := f.s.Takedown("s", "r1", (&sealer{}).seal)
			if err != nil {
				t.Fatal(err)
			}
			g := l.open(t, snap, l.opt)
			if _, err := g.s.Stat("s"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("segment back after the crash: %v", err)
			}
			if l.name == "file" && len(g.s.Recovered().RemovedOrphans) != 1 {
				t.Fatalf("orphan not removed: %+v", g.s.Recovered())
			}
			ts, err := g.s.TombstoneOf("s")
			if err != nil || ts.SHA256 != e.SHA256 {
				t.Fatalf("tombstone %+v %v", ts, err)
			}
			rs, _ := g.s.Receipts("s")
			if len(rs) != 1 || !bytes.Equal(rs[0].Receipt, res.Receipt) {
				t.Fatalf("receipts %+v, want %q", rs, res.Receipt)
			}
			if _, err := g.s.Reserve("s", e.Size, e.SHA256); !errors.Is(err, ErrEvicted) {
				t.Fatalf("reserve: %v", err)
			}
			checkInvariant(t, g)
		})
	}
}
