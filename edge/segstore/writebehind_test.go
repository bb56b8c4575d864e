package segstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func patternedBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131>>3 + i>>20)
	}
	return b
}

// TestWriteBehindHints: every full window written starts that window's
// writeback once, whatever the write sizes; less than a window, or a
// window of 0, starts none; the file gets exactly the bytes written.
func TestWriteBehindHints(t *testing.T) {
	data := patternedBytes(2*writeBehindWindow + 5)
	for _, tc := range []struct {
		name   string
		window int64
		n      int
		hints  int
	}{
		{"two windows", writeBehindWindow, len(data), 2},
		{"under a window", writeBehindWindow, writeBehindWindow - 1, 0},
		{"off", 0, len(data), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w := &writeBehind{f: f, window: tc.window}
			for p := data[:tc.n]; len(p) > 0; {
				k := min(len(p), 1<<20+3) // not a divisor of the window
				if _, err := w.Write(p[:k]); err != nil {
					t.Fatal(err)
				}
				p = p[k:]
			}
			if w.hints != tc.hints || w.started != int64(tc.hints)*tc.window {
				t.Fatalf("%d hints up to %d, want %d", w.hints, w.started, tc.hints)
			}
			got, err := os.ReadFile(f.Name())
			if err != nil || !bytes.Equal(got, data[:tc.n]) {
				t.Fatalf("file has %d bytes (err %v), differing from the %d written", len(got), err, tc.n)
			}
		})
	}
}

// TestLargeSegmentContractWithWriteBehind: a segment of several windows
// is stored, verified and committed as any other (the write-behind is
// only a hint): the content and entry after a reopen are what was sent,
// and one with a wrong digest leaves nothing behind (checkInvariant: no
// temp file, no entry).
func TestLargeSegmentContractWithWriteBehind(t *testing.T) {
	opt := Options{QuotaBytes: 64 << 20, QuotaSegments: 4, MaxSegmentBytes: 32 << 20}
	f := newStore(t, "", opt)
	data := patternedBytes(3*writeBehindWindow + 12345)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])

	wrong := sha256.Sum256([]byte("other"))
	if _, err := f.s.Write("bad", int64(len(data)), hex.EncodeToString(wrong[:]), bytes.NewReader(data), "peer"); !errors.Is(err, ErrChecksum) {
		t.Fatalf("wrong digest: %v, want ErrChecksum", err)
	}
	if _, err := f.s.Write("big", int64(len(data)), digest, bytes.NewReader(data), "peer"); err != nil {
		t.Fatal(err)
	}
	reopen(t, f, "edged.db", opt) // newStore's cleanup checks the reopened store
	e, err := f.s.Stat("big")
	if err != nil || e.Size != int64(len(data)) || e.SHA256 != digest {
		t.Fatalf("after reopen: %+v, %v", e, err)
	}
	if err := f.s.Verify("big"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Stat("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bad: %v, want ErrNotFound", err)
	}
}

// BenchmarkReceive64MiB receives 64 MiB segments into a store on the real
// disk (the test's temp dir), alternating rounds without and with the
// write-behind, and reports each one's receive (copy, hash, page cache)
// and commit (fsync or syncfs, rename, index) time per segment. Run it on
// the disk that matters: TMPDIR=/path/on/disk.
func BenchmarkReceive64MiB(b *testing.B) {
	const size = 64 << 20
	dir := b.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := Open(dir, db, Options{QuotaBytes: 2 * size, QuotaSegments: 4, MaxSegmentBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	data := patternedBytes(size)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	var recv, commit [2]time.Duration
	var rounds [2]int
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % 2 // 0: off, 1: on
		s.writeBehind = int64(k) * writeBehindWindow
		r, err := s.Reserve("seg", size, digest)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		st, err := r.Receive(io.NopCloser(bytes.NewReader(data)), "bench")
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := st.Commit(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		recv[k] += t1.Sub(t0)
		commit[k] += t2.Sub(t1)
		rounds[k]++
		b.StopTimer()
		if err := s.Evict("seg"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	for k, name := range []string{"off", "on"} {
		if rounds[k] == 0 {
			continue
		}
		n := float64(rounds[k])
		b.ReportMetric(recv[k].Seconds()*1e3/n, name+"-receive-ms")
		b.ReportMetric(commit[k].Seconds()*1e3/n, name+"-commit-ms")
		b.ReportMetric((recv[k]+commit[k]).Seconds()*1e3/n, name+"-total-ms")
	}
}

// BenchmarkReceive64MiBWithSmallWrites measures what the write-behind does
// to small segments sharing the disk: while one 64 MiB segment is
// received and committed, another goroutine stores 4 KiB segments one
// after another (each Store.Write, so each waits for its own durable
// commit). Rounds without and with the write-behind alternate; reported
// per round: the 64 MiB segment's time and the 4 KiB commits per second
// while it was being stored.
func BenchmarkReceive64MiBWithSmallWrites(b *testing.B) {
	const size = 64 << 20
	dir := b.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := Open(dir, db, Options{QuotaBytes: 4 * size, QuotaSegments: 1 << 20, MaxSegmentBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	data := patternedBytes(size)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	small := patternedBytes(4 << 10)
	ssum := sha256.Sum256(small)
	sdigest := hex.EncodeToString(ssum[:])
	var bigTime [2]time.Duration
	var smallCommits [2]int
	var rounds [2]int
	seq := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % 2
		s.writeBehind = int64(k) * writeBehindWindow
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				seq++
				if _, err := s.Write(fmt.Sprintf("small-%d", seq), int64(len(small)), sdigest, bytes.NewReader(small), "bench"); err != nil {
					b.Error(err)
					done <- n
					return
				}
				n++
			}
		}()
		t0 := time.Now()
		if _, err := s.Write("big", size, digest, bytes.NewReader(data), "bench"); err != nil {
			b.Fatal(err)
		}
		bigTime[k] += time.Since(t0)
		close(stop)
		smallCommits[k] += <-done
		rounds[k]++
		b.StopTimer()
		if err := s.Evict("big"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	for k, name := range []string{"off", "on"} {
		if rounds[k] == 0 {
			continue
		}
		b.ReportMetric(bigTime[k].Seconds()*1e3/float64(rounds[k]), name+"-64MiB-ms")
		b.ReportMetric(float64(smallCommits[k])/bigTime[k].Seconds(), name+"-4KiB/s")
	}
}
