package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestReserveMakesRoom: a reservation the quota cannot hold asks MakeRoom
// for exactly the shortfall, without the Store's lock (the callback
// evicts through the Store), and is retried once; if nothing was freed it
// is refused with ErrQuota.
func TestReserveMakesRoom(t *testing.T) {
	opt := testOpts
	opt.QuotaBytes, opt.QuotaSegments, opt.MaxSegmentBytes = 1000, 3, 1000
	var f *fixture
	var asked [][2]int64
	evict := ""
	opt.MakeRoom = func(b, n int64) {
		asked = append(asked, [2]int64{b, n})
		if evict != "" {
			must(t, f.s.Evict(evict))
		}
	}
	f = newStore(t, "", opt)
	put(t, f.s, "a", content(300, 1))
	put(t, f.s, "b", content(300, 2))
	put(t, f.s, "c", content(300, 3))

	evict = "a"
	d := content(200, 4)
	put(t, f.s, "d", d) // 900+200 > 1000 bytes, 4 > 3 segments
	if len(asked) != 1 || asked[0] != [2]int64{100, 1} {
		t.Fatalf("MakeRoom asked for %v, want [[100 1]]", asked)
	}
	if _, err := f.s.Stat("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a: %v", err)
	}

	asked, evict = nil, ""
	e := content(50, 5)
	if _, err := f.s.Write("e", int64(len(e)), digest(e), bytes.NewReader(e), ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("Write with nothing freed = %v", err)
	}
	if len(asked) != 1 || asked[0] != [2]int64{0, 1} {
		t.Fatalf("MakeRoom asked for %v, want [[0 1]]", asked)
	}
	// A segment already held is acknowledged even when full, without
	// asking for room.
	asked = nil
	if _, err := f.s.Reserve("d", int64(len(d)), digest(d)); !errors.Is(err, ErrAlreadyHave) || len(asked) != 0 {
		t.Fatalf("Reserve(held) = %v, asked %v", err, asked)
	}
}

// enospcAfter fails every write once n bytes went through, like a disk
// that filled up under the write.
type enospcAfter struct {
	w io.Writer
	n int
}

func (e *enospcAfter) Write(p []byte) (int, error) {
	if len(p) > e.n {
		k, _ := e.w.Write(p[:e.n])
		e.n = 0
		return k, &os.PathError{Op: "write", Path: "temp", Err: syscall.ENOSPC}
	}
	e.n -= len(p)
	return e.w.Write(p)
}

// TestDiskFullMidWrite: the disk refuses a write part-way through a
// segment (ENOSPC) although the quota had room. The write fails with
// ErrQuota (the receiver NACKs quota), the temp file is gone, nothing is
// indexed, the quota is whole, MakeRoom is asked for the segment's size,
// and once the disk has room the same segment is stored.
func TestDiskFullMidWrite(t *testing.T) {
	opt := testOpts
	full := true
	opt.WrapTemp = func(id string, w io.Writer) io.Writer {
		if full && id == "x" {
			return &enospcAfter{w: w, n: 70_000}
		}
		return w
	}
	var asked [][2]int64
	opt.MakeRoom = func(b, n int64) { asked = append(asked, [2]int64{b, n}) }
	f := newStore(t, "", opt)
	put(t, f.s, "other", content(10, 1))
	x := content(200_000, 9)
	_, err := f.s.Write("x", int64(len(x)), digest(x), bytes.NewReader(x), "peer-x")
	if !errors.Is(err, ErrQuota) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Write = %v, want ErrQuota wrapping ENOSPC", err)
	}
	if len(asked) != 1 || asked[0] != [2]int64{int64(len(x)), 0} {
		t.Fatalf("MakeRoom asked for %v", asked)
	}
	if _, err := f.s.Stat("x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat(x) = %v", err)
	}
	checkInvariant(t, f) // no temp file left, usage agrees with the index
	if u := f.s.Usage(); u.Bytes != 10 || u.Segments != 1 || u.ReservedBytes != 0 {
		t.Fatalf("usage %+v", u)
	}
	full = false
	put(t, f.s, "x", x)
}

// TestDiskFullAtEachStep: ENOSPC from any step of the commit path (fsync
// and close can report it too, and so can the index commit) is ErrQuota
// and leaves nothing behind.
func TestDiskFullAtEachStep(t *testing.T) {
	b := content(20_000, 3)
	for _, at := range writeSteps[:len(writeSteps)-1] { // stepIndexed cannot fail
		t.Run(string(at), func(t *testing.T) {
			f := newStore(t, "", testOpts)
			f.s.fault = func(st step) error {
				if st == at {
					return fmt.Errorf("at %s: %w", at, syscall.ENOSPC)
				}
				return nil
			}
			if _, err := f.s.Write("s", int64(len(b)), digest(b), bytes.NewReader(b), ""); !errors.Is(err, ErrQuota) {
				t.Fatalf("Write = %v", err)
			}
			if _, err := os.Stat(filepath.Join(f.dir, "segments", "s")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("segment file left: %v", err)
			}
			f.s.fault = nil
			put(t, f.s, "s", b)
		})
	}
}
