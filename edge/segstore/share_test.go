package segstore

import (
	"bytes"
	"errors"
	"testing"
)

// TestSourceShare: one source's reservations are bounded by
// SourceReserveBytes and SourceReserveSegments, whatever the quota has
// left; other sources and Reserve (no source) are not; a share frees as
// its reservations are released, received and failed, or committed; and
// a source over its share never makes MakeRoom evict anything.
func TestSourceShare(t *testing.T) {
	opt := testOpts // 1 MiB, 16 segments, 256 KiB per segment
	opt.SourceReserveBytes, opt.SourceReserveSegments = 300<<10, 3
	var asked int
	opt.MakeRoom = func(int64, int64) { asked++ }
	f := newStore(t, "", opt)
	reserve := func(source, id string, size int) (*Reservation, error) {
		return f.s.ReserveFrom(source, id, int64(size), digest(content(size, 1)))
	}
	r1, err := reserve("a", "a1", 200<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reserve("a", "a2", 101<<10); !errors.Is(err, ErrSourceShare) || errors.Is(err, ErrQuota) {
		t.Fatalf("a over its bytes: %v, want ErrSourceShare (not ErrQuota)", err)
	}
	// Another source, and local ingest, still get room.
	rb, err := reserve("b", "b1", 250<<10)
	if err != nil {
		t.Fatalf("b: %v", err)
	}
	ri, err := f.s.Reserve("local", 250<<10, digest(content(250<<10, 1)))
	if err != nil {
		t.Fatalf("no source: %v", err)
	}
	// Count: a holds 1 + 2 small ones = 3, the fourth is refused.
	small := []*Reservation{}
	for _, id := range []string{"a2", "a3"} {
		r, err := reserve("a", id, 10)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		small = append(small, r)
	}
	if _, err := reserve("a", "a4", 10); !errors.Is(err, ErrSourceShare) {
		t.Fatalf("a over its count: %v, want ErrSourceShare", err)
	}
	// An offer above the maximum segment size is still too_large.
	if _, err := reserve("a", "huge", 300<<10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large from a full share: %v, want ErrTooLarge", err)
	}
	// Release, a failed receive and a commit each give the share back.
	small[0].Release()
	if _, err := small[1].Receive(bytes.NewReader([]byte("short")), "a"); !errors.Is(err, ErrSize) {
		t.Fatalf("short receive: %v", err)
	}
	if _, err := r1.Write(bytes.NewReader(content(200<<10, 1)), "a"); err != nil {
		t.Fatal(err)
	}
	r3, err := reserve("a", "a6", 256<<10)
	if err != nil {
		t.Fatalf("a after its reservations finished: %v", err)
	}
	r3.Release()
	rb.Release()
	ri.Release()
	if asked != 0 {
		t.Fatalf("MakeRoom asked %d times for a source over its share", asked)
	}
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if len(f.s.bySource) != 0 {
		t.Fatalf("shares left: %+v", f.s.bySource)
	}
}
