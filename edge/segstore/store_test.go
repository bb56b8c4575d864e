package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
	bolt "go.etcd.io/bbolt"
)

func TestWriteReadRoundTrip(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	opt := testOpts
	opt.Now = func() time.Time { return now }
	f := newStore(t, "", opt)
	b := content(100_000, 1)
	e := put(t, f.s, "seg-1", b)
	if e.ID != "seg-1" || e.Size != int64(len(b)) || e.SHA256 != digest(b) || e.Source != "peer-x" || !e.Received.Equal(now) || e.Relayed {
		t.Fatalf("entry %+v", e)
	}
	if got := read(t, f.s, "seg-1"); !bytes.Equal(got, b) {
		t.Fatal("content differs")
	}
	st, err := f.s.Stat("seg-1")
	if err != nil || st != e {
		t.Fatalf("Stat = %+v %v", st, err)
	}
	put(t, f.s, "seg-0", content(10, 2))
	list, err := f.s.List()
	if err != nil || len(list) != 2 || list[0].ID != "seg-0" || list[1].ID != "seg-1" {
		t.Fatalf("List = %+v %v", list, err)
	}
	// Upper-case digests are accepted and stored lower case.
	up := content(5, 3)
	if e, err := f.s.Write("seg-up", 5, strings.ToUpper(digest(up)), bytes.NewReader(up), ""); err != nil || e.SHA256 != digest(up) {
		t.Fatalf("upper-case digest: %+v %v", e, err)
	}
	// Empty segments are legal.
	put(t, f.s, "empty", nil)

	first, marked, err := f.s.MarkRelayed("seg-1")
	if err != nil || !marked || !first.Relayed || !first.RelayedAt.Equal(now) {
		t.Fatalf("MarkRelayed = %+v %v %v", first, marked, err)
	}
	now = now.Add(time.Hour)
	again, marked, err := f.s.MarkRelayed("seg-1")
	if err != nil || marked || !again.RelayedAt.Equal(first.RelayedAt) {
		t.Fatalf("MarkRelayed not idempotent: %+v %v %v", again, marked, err)
	}
	if _, _, err := f.s.MarkRelayed("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MarkRelayed(nope) = %v", err)
	}
	if _, err := f.s.Stat("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat(nope) = %v", err)
	}
	if _, _, err := f.s.Open("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open(nope) = %v", err)
	}
}

func TestAlreadyHaveAndConflict(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 100, QuotaSegments: 1, MaxSegmentBytes: 100})
	b := content(100, 9)
	e := put(t, f.s, "s", b)
	// The quota is now full (bytes and count), yet the same segment is
	// recognised, without reading the stream, so the sender is re-ACKed.
	got, err := f.s.Write("s", 100, digest(b), failReader{t}, "peer-y")
	if !errors.Is(err, ErrAlreadyHave) || got != e {
		t.Fatalf("re-write = %+v %v, want stored entry and ErrAlreadyHave", got, err)
	}
	if _, err := f.s.Reserve("s", 100, digest(b)); !errors.Is(err, ErrAlreadyHave) {
		t.Fatalf("Reserve = %v", err)
	}
	other := content(100, 10)
	if _, err := f.s.Write("s", 100, digest(other), failReader{t}, ""); !errors.Is(err, ErrDigestConflict) {
		t.Fatalf("different digest = %v", err)
	}
	if _, err := f.s.Write("s", 99, digest(b), failReader{t}, ""); !errors.Is(err, ErrDigestConflict) {
		t.Fatalf("different size = %v", err)
	}
	if got := read(t, f.s, "s"); !bytes.Equal(got, b) {
		t.Fatal("stored content changed")
	}
}

func TestBadContentLeavesNothing(t *testing.T) {
	b := content(1000, 4)
	cases := []struct {
		name string
		size int64
		sha  string
		src  func() *bytes.Reader
		want error
	}{
		{"checksum", 1000, digest(content(1000, 5)), func() *bytes.Reader { return bytes.NewReader(b) }, ErrChecksum},
		{"short", 1001, digest(b), func() *bytes.Reader { return bytes.NewReader(b) }, ErrSize},
		{"long", 999, digest(b[:999]), func() *bytes.Reader { return bytes.NewReader(b) }, ErrSize},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newStore(t, "", testOpts)
			if _, err := f.s.Write("s", tc.size, tc.sha, tc.src(), ""); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			assertEmpty(t, f)
		})
	}
	t.Run("reader error", func(t *testing.T) {
		f := newStore(t, "", testOpts)
		boom := errors.New("connection reset")
		if _, err := f.s.Write("s", 1000, digest(b), &errReader{n: 500, err: boom}, ""); !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		assertEmpty(t, f)
	})
}

func assertEmpty(t *testing.T, f *fixture) {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(f.dir, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 0 {
		t.Fatalf("segments/ holds %d files after a failed write", len(des))
	}
	if l, _ := f.s.List(); len(l) != 0 {
		t.Fatalf("index holds %v", l)
	}
	if u := f.s.Usage(); u.Bytes != 0 || u.Segments != 0 || u.ReservedBytes != 0 || u.ReservedSegments != 0 {
		t.Fatalf("usage %+v", u)
	}
}

func TestInvalidOffers(t *testing.T) {
	f := newStore(t, "", testOpts)
	good := digest(nil)
	for _, tc := range []struct {
		id   string
		size int64
		sha  string
	}{
		{"", 0, good}, {"../etc", 0, good}, {"a/b", 0, good}, {".tmp-x", 0, good}, {".", 0, good},
		{"..", 0, good}, {"a b", 0, good}, {"é", 0, good}, {strings.Repeat("x", MaxIDLen+1), 0, good},
		{"ok", -1, good}, {"ok", 0, "abc"}, {"ok", 0, good[:62]}, {"ok", 0, strings.Repeat("z", 64)},
	} {
		if _, err := f.s.Reserve(tc.id, tc.size, tc.sha); !errors.Is(err, ErrInvalid) {
			t.Errorf("Reserve(%q, %d, %q) = %v, want ErrInvalid", tc.id, tc.size, tc.sha, err)
		}
	}
	if err := ValidID(strings.Repeat("x", MaxIDLen)); err != nil {
		t.Error(err)
	}
}

func TestQuota(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 100, QuotaSegments: 3, MaxSegmentBytes: 60})
	s := f.s
	if err := s.AllowSegment(61); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("61 > max: %v", err)
	}
	if err := s.AllowSegment(-1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative: %v", err)
	}
	r, err := s.Reserve("a", 60, digest(content(60, 1)))
	if err != nil {
		t.Fatal(err)
	}
	// The reservation counts: 60 reserved + 41 > 100.
	if err := s.AllowSegment(41); !errors.Is(err, ErrQuota) {
		t.Fatalf("reservation not counted: %v", err)
	}
	if _, err := s.Reserve("b", 41, digest(content(41, 1))); !errors.Is(err, ErrQuota) {
		t.Fatalf("Reserve over quota: %v", err)
	}
	if u := s.Usage(); u.ReservedBytes != 60 || u.ReservedSegments != 1 {
		t.Fatalf("usage %+v", u)
	}
	r.Release()
	r.Release() // idempotent
	if err := s.AllowSegment(41); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if _, err := r.Write(bytes.NewReader(nil), ""); !errors.Is(err, ErrReservationUsed) {
		t.Fatalf("Write after Release = %v", err)
	}
	put(t, s, "a", content(60, 1))
	put(t, s, "b", content(20, 2))
	put(t, s, "c", content(20, 3))
	if err := s.AllowSegment(0); !errors.Is(err, ErrQuota) {
		t.Fatalf("segment count quota: %v", err)
	}
	if err := s.Evict("a"); err != nil {
		t.Fatal(err)
	}
	if u := s.Usage(); u.Bytes != 40 || u.Segments != 2 {
		t.Fatalf("usage after evict %+v", u)
	}
	if err := s.AllowSegment(60); err != nil {
		t.Fatalf("evict did not free quota: %v", err)
	}
}

// TestConcurrentReceiversCannotOvershoot: many receivers reserve at once;
// the admitted ones fit the quota exactly, and after they all write, the
// stored total is within the quota.
func TestConcurrentReceiversCannotOvershoot(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 100, QuotaSegments: 100, MaxSegmentBytes: 30})
	const n = 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := content(30, byte(i))
			<-start
			r, err := f.s.Reserve(fmt.Sprintf("s%02d", i), 30, digest(b))
			if errors.Is(err, ErrQuota) {
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			defer r.Release()
			mu.Lock()
			admitted++
			mu.Unlock()
			if _, err := r.Write(bytes.NewReader(b), ""); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	// 30-byte segments into 100 bytes: 3 fit, whatever the interleaving.
	if u := f.s.Usage(); admitted != 3 || u.Bytes != 90 || u.Segments != 3 {
		t.Fatalf("admitted %d, usage %+v", admitted, u)
	}
}

func TestBusy(t *testing.T) {
	f := newStore(t, "", testOpts)
	b := content(10, 1)
	r, err := f.s.Reserve("s", 10, digest(b))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Reserve("s", 10, digest(b)); !errors.Is(err, ErrBusy) {
		t.Fatalf("second reserve = %v", err)
	}
	if err := f.s.Evict("s"); !errors.Is(err, ErrBusy) {
		t.Fatalf("evict while writing = %v", err)
	}
	if _, err := r.Write(bytes.NewReader(b), ""); err != nil {
		t.Fatal(err)
	}
	r.Release() // no-op after Write
	if _, err := f.s.Reserve("s", 10, digest(b)); !errors.Is(err, ErrAlreadyHave) {
		t.Fatalf("after write = %v", err)
	}
	if err := f.s.Evict("s"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Evict("s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("evict twice = %v", err)
	}
}

func TestEvictIfWithLedgerGate(t *testing.T) {
	f := newStore(t, "", testOpts)
	led, err := ledger.Open(f.db)
	if err != nil {
		t.Fatal(err)
	}
	put(t, f.s, "s", content(10, 1))
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	peers := []string{"a", "b"}
	if _, err := led.EnsureScheduled("s", peers, now); err != nil {
		t.Fatal(err)
	}
	gate := led.EvictionGate("s", peers, ledger.AllPeers)
	if err := f.s.EvictIf("s", gate); !errors.Is(err, ledger.ErrEvictionBlocked) {
		t.Fatalf("EvictIf with pending deliveries = %v", err)
	}
	if _, err := f.s.Stat("s"); err != nil {
		t.Fatalf("blocked eviction removed the segment: %v", err)
	}
	for _, p := range peers {
		if _, ok, err := led.TryTransitionInflight("s", p, now); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, err := led.TransitionAcked("s", p, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.EvictIf("s", gate); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Stat("s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after eviction: %v", err)
	}
	if u := f.s.Usage(); u.Bytes != 0 || u.Segments != 0 {
		t.Fatalf("usage %+v", u)
	}
	gateErr := errors.New("no")
	put(t, f.s, "t", content(10, 2))
	if err := f.s.EvictIf("t", func(*bolt.Tx) error { return gateErr }); !errors.Is(err, gateErr) {
		t.Fatalf("gate error not returned: %v", err)
	}
}

// TestConcurrentWritesAndEvictions exercises the locking under -race.
func TestConcurrentWritesAndEvictions(t *testing.T) {
	f := newStore(t, "", Options{QuotaBytes: 1 << 20, QuotaSegments: 1000, MaxSegmentBytes: 4096})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				id := fmt.Sprintf("w%d-%d", w, i%3)
				b := content(1000+i, byte(w))
				_, err := f.s.Write(id, int64(len(b)), digest(b), bytes.NewReader(b), "")
				if err != nil && !errors.Is(err, ErrDigestConflict) && !errors.Is(err, ErrAlreadyHave) {
					t.Error(err)
				}
				if i%2 == 1 {
					if err := f.s.Evict(id); err != nil && !errors.Is(err, ErrNotFound) {
						t.Error(err)
					}
				}
				f.s.Usage()
			}
		}()
	}
	wg.Wait()
}

// TestIDsMatchTheWire: every id the store accepts must be one the wire
// protocol can carry. A segment ingested under an id that OFFER refuses
// (a leading '-' passed ValidID but not wire.CheckSegmentID) is stored,
// scheduled and then fails every relay attempt at encoding until it is
// deadlettered: it can never leave the node.
func TestIDsMatchTheWire(t *testing.T) {
	f := newStore(t, "", testOpts)
	for _, id := range []string{"-x", "-", "--help", "_x", "x-", "a.b", "0", ".x", "x/y", strings.Repeat("y", MaxIDLen)} {
		wireErr := wire.CheckSegmentID(id)
		if err := ValidID(id); (err == nil) != (wireErr == nil) {
			t.Errorf("ValidID(%q) = %v, wire.CheckSegmentID = %v: they must agree", id, err, wireErr)
		}
		if wireErr != nil {
			body := []byte("z")
			if _, err := f.s.Write(id, 1, digest(body), bytes.NewReader(body), ""); !errors.Is(err, ErrInvalid) {
				t.Errorf("Write(%q) = %v, want ErrInvalid (the wire cannot carry it)", id, err)
			}
		}
	}
}
