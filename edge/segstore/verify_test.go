package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestReadVerifies: a stored copy damaged after its commit (a flipped
// byte, same size, so the start-up check without hashing passes it; or
// cut short) is caught by the next read: the Reader returns ErrDamaged
// instead of the segment's last bytes, so a sender never sends it whole;
// the copy is quarantined as at start (bytes intact, entry dropped,
// quota freed), reported (Quarantined, OnQuarantine) and wanted back; a
// good copy stored again is refetched and no longer wanted. A good copy
// reads whole without error. Segment files and pack records alike.
func TestReadVerifies(t *testing.T) {
	damage := map[string]func(t *testing.T, path string, off int64){
		"flipped": func(t *testing.T, path string, off int64) { flipByte(t, path, off+1234) },
		"torn": func(t *testing.T, path string, off int64) {
			if err := os.Truncate(path, off+1234); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, m := range []storeMode{{"file", testOpts}, packModes[0]} {
		for name, dmg := range damage {
			t.Run(m.name+"/"+name, func(t *testing.T) {
				readVerifies(t, m.opts, dmg)
			})
		}
	}
}

func readVerifies(t *testing.T, opt Options, damage func(t *testing.T, path string, off int64)) {
	var mu sync.Mutex
	var heard []Quarantined
	var refetched []string
	opt.OnQuarantine = func(q Quarantined) { mu.Lock(); heard = append(heard, q); mu.Unlock() }
	opt.OnRefetched = func(e Entry) { mu.Lock(); refetched = append(refetched, e.ID); mu.Unlock() }
	f := newStore(t, "", opt)
	if opt.PackMaxBytes > 0 && !f.s.Packing() {
		t.Skip("file system cannot punch holes: no packs")
	}
	good, bad := content(5000, 1), content(7000, 2)
	put(t, f.s, "good", good)
	e := put(t, f.s, "bad", bad)
	if e.Packed() != (opt.PackMaxBytes > 0) {
		t.Fatalf("packed %v with PackMaxBytes %d", e.Packed(), opt.PackMaxBytes)
	}
	if got := read(t, f.s, "good"); !bytes.Equal(got, good) {
		t.Fatal("good copy read back wrong")
	}
	path, off, err := f.s.Where("bad")
	if err != nil {
		t.Fatal(err)
	}
	damage(t, path, off)

	r, _, err := f.s.Open("bad")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if !errors.Is(err, ErrDamaged) || int64(len(got)) >= e.Size {
		t.Fatalf("read of the damaged copy: %d of %d bytes, err %v; want fewer bytes and ErrDamaged", len(got), e.Size, err)
	}
	if _, err := f.s.Stat("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat(bad) after the read = %v, want ErrNotFound", err)
	}
	if u := f.s.Usage(); u.Bytes != int64(len(good)) || u.Segments != 1 {
		t.Fatalf("usage %+v", u)
	}
	qs := f.s.Quarantined()
	mu.Lock()
	if len(qs) != 1 || qs[0].ID != "bad" || qs[0].Found != FoundOnRead || len(heard) != 1 || heard[0] != qs[0] {
		t.Fatalf("quarantined %+v, heard %+v", qs, heard)
	}
	mu.Unlock()
	if _, err := os.Stat(filepath.Join(f.dir, QuarantineDir, qs[0].File)); err != nil {
		t.Fatal(err)
	}
	w, err := f.s.Wanted()
	if err != nil || len(w) != 1 || w[0].ID != "bad" || w[0].SHA256 != e.SHA256 || w[0].Size != e.Size {
		t.Fatalf("wanted %+v, %v", w, err)
	}

	// Wanted survives a restart; a good copy stored again ends it.
	reopen(t, f, "edged.db", opt)
	if w, _ := f.s.Wanted(); len(w) != 1 {
		t.Fatalf("wanted after reopen: %+v", w)
	}
	put(t, f.s, "bad", bad)
	if w, _ := f.s.Wanted(); len(w) != 0 {
		t.Fatalf("wanted after the good copy came back: %+v", w)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(refetched, []string{"bad"}) {
		t.Fatalf("refetched %v", refetched)
	}
}

// TestReadSeekReverifies: a sender that rewinds (a retry on a fresh
// connection) reads the segment again from the start and it is verified
// again; reading it twice is not damage.
func TestReadSeekReverifies(t *testing.T) {
	f := newStore(t, "", testOpts)
	b := content(100_000, 3)
	put(t, f.s, "s", b)
	r, _, err := f.s.Open("s")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for range 2 {
		half := make([]byte, 50_000)
		if _, err := io.ReadFull(r, half); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read after rewinds: %d bytes, %v", len(got), err)
	}
}

// TestStartUpQuarantineWanted: a copy the start-up check quarantines is
// wanted back too, and so is an entry whose file vanished.
func TestStartUpQuarantineWanted(t *testing.T) {
	f := newStore(t, "", testOpts)
	put(t, f.s, "bad", content(7000, 2))
	put(t, f.s, "gone", content(3000, 4))
	put(t, f.s, "ok", content(1000, 5))
	flipByte(t, filepath.Join(f.dir, "segments", "bad"), 10)
	if err := os.Remove(filepath.Join(f.dir, "segments", "gone")); err != nil {
		t.Fatal(err)
	}
	opt := testOpts
	opt.VerifyOnOpen = true
	rep := reopen(t, f, "edged.db", opt)
	if len(rep.Quarantined) != 1 || rep.Quarantined[0].Found != FoundAtStart {
		t.Fatalf("report %+v", rep)
	}
	w, err := f.s.Wanted()
	if err != nil || len(w) != 2 || w[0].ID != "bad" || w[1].ID != "gone" {
		t.Fatalf("wanted %+v, %v", w, err)
	}
}

// BenchmarkRead is what verify on read costs a sender: reading a stored
// segment whole through the verifying Reader, against the same read with
// the verification off (as Verify reads). The difference is one SHA-256
// of the content.
func BenchmarkRead(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, verified := range []bool{true, false} {
			b.Run(fmt.Sprintf("%dKiB/verified=%v", size>>10, verified), func(b *testing.B) {
				dir := b.TempDir()
				db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				s, err := Open(dir, db, Options{QuotaBytes: 1 << 30, QuotaSegments: 10, MaxSegmentBytes: 1 << 20, PackMaxBytes: DefaultPackMaxBytes})
				if err != nil {
					b.Fatal(err)
				}
				c := content(size, 7)
				if _, err := s.Write("s", int64(size), digest(c), bytes.NewReader(c), ""); err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 64<<10)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for b.Loop() {
					r, _, err := s.Open("s")
					if err != nil {
						b.Fatal(err)
					}
					if !verified {
						r.v = nil
					}
					if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, buf); err != nil {
						b.Fatal(err)
					}
					r.Close()
				}
			})
		}
	}
}
