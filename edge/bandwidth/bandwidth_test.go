package bandwidth

import (
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// fakeClock advances only when a wait asks it to: After moves time forward
// by d and fires at once, so a sequence of writes runs instantly and its
// schedule is exactly reproducible. With block set, After never fires and
// reports the wait on waiting instead.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	block   bool
	waiting chan time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), waiting: make(chan time.Duration, 1)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	if f.block {
		f.waiting <- d
		return ch
	}
	f.now = f.now.Add(d)
	ch <- f.now
	return ch
}

// sent is one write that reached the socket: when (fake time) and how much.
type sent struct {
	at time.Time
	n  int
}

// spy sits between the limiter and a real TCP connection and records
// each write and the write deadlines the limiter sets.
type spy struct {
	net.Conn
	clock     *fakeClock
	mu        sync.Mutex
	log       []sent
	deadlines []time.Time
}

func (s *spy) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.log = append(s.log, sent{s.clock.Now(), len(p)})
	s.mu.Unlock()
	return s.Conn.Write(p)
}

func (s *spy) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadlines = append(s.deadlines, t)
	s.mu.Unlock()
	return s.Conn.SetWriteDeadline(t)
}

// tcpPair returns the client end of a loopback TCP connection whose server
// end is drained until the test ends.
func tcpPair(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, s)
		s.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		ln.Close()
		<-done
	})
	return c
}

// checkBound: over every interval between two writes, the bytes sent are
// at most burst + rate·interval (the token bucket's promise).
func checkBound(t *testing.T, log []sent, rate int64) {
	t.Helper()
	burst := int64(Burst(rate))
	for i := range log {
		var sum int64
		for j := i; j < len(log); j++ {
			sum += int64(log[j].n)
			// Ceil: the bucket's delays are rounded to whole nanoseconds.
			allowed := burst + int64(math.Ceil(float64(rate)*log[j].at.Sub(log[i].at).Seconds()))
			if sum > allowed {
				t.Fatalf("writes %d..%d: %d bytes in %v, bound %d", i, j, sum, log[j].at.Sub(log[i].at), allowed)
			}
		}
	}
}

func write(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if _, err := c.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
}

// TestPerPeerLimit: 1 MiB to one peer at 64 KiB/s takes exactly (1 MiB −
// burst) / rate of (fake) time, in chunks of at most MinBurst, within the
// bucket's bound over every interval; another peer has its own bucket.
func TestPerPeerLimit(t *testing.T) {
	const rate = 64 << 10
	clock := newFakeClock()
	l := New(0, rate, nil, clock)
	s := &spy{Conn: tcpPair(t), clock: clock}
	c := l.Wrap("b", s)
	start := clock.Now()
	write(t, c, 1<<20)
	want := time.Duration(float64(1<<20-Burst(rate)) / rate * float64(time.Second))
	if got := clock.Now().Sub(start); got != want {
		t.Fatalf("1 MiB took %v, want %v", got, want)
	}
	for _, w := range s.log {
		if w.n > MinBurst {
			t.Fatalf("a write of %d bytes > MinBurst", w.n)
		}
	}
	checkBound(t, s.log, rate)

	// Peer c starts with a full bucket of its own.
	s2 := &spy{Conn: tcpPair(t), clock: clock}
	before := clock.Now()
	write(t, l.Wrap("c", s2), Burst(rate))
	if clock.Now() != before {
		t.Fatalf("peer c waited for peer b's bucket")
	}
	// A second connection to b shares b's (empty) bucket.
	s3 := &spy{Conn: tcpPair(t), clock: clock}
	write(t, l.Wrap("b", s3), MinBurst)
	if got := clock.Now().Sub(before); got != time.Duration(float64(MinBurst)/rate*float64(time.Second)) {
		t.Fatalf("second connection to b waited %v", got)
	}
}

// TestTotalLimit: with only a total limit, two peers share one bucket:
// the bytes to both together obey its bound.
func TestTotalLimit(t *testing.T) {
	const rate = 128 << 10
	clock := newFakeClock()
	l := New(rate, 0, nil, clock)
	var log []sent
	var mu sync.Mutex
	start := clock.Now()
	for range 4 {
		for _, peer := range []string{"b", "c"} {
			s := &spy{Conn: tcpPair(t), clock: clock}
			write(t, l.Wrap(peer, s), 100_000)
			mu.Lock()
			log = append(log, s.log...)
			mu.Unlock()
		}
	}
	checkBound(t, log, rate)
	want := time.Duration(float64(800_000-Burst(rate)) / rate * float64(time.Second))
	if got := clock.Now().Sub(start); got != want {
		t.Fatalf("800000 bytes took %v, want %v", got, want)
	}
}

// TestBothLimits: the tighter of the two binds.
func TestBothLimits(t *testing.T) {
	clock := newFakeClock()
	l := New(1<<20, 32<<10, nil, clock)
	s := &spy{Conn: tcpPair(t), clock: clock}
	write(t, l.Wrap("b", s), 256<<10)
	checkBound(t, s.log, 32<<10)
}

// TestNoLimitIsTheConnItself: without limits Wrap adds nothing.
func TestNoLimitIsTheConnItself(t *testing.T) {
	c := tcpPair(t)
	if New(0, 0, nil, nil).Wrap("b", c) != c {
		t.Fatal("Wrap without limits wrapped")
	}
}

// TestWaitMovesDeadline: time spent waiting for tokens is added to the
// write deadline the caller set, so throttling is not taken for idleness.
func TestWaitMovesDeadline(t *testing.T) {
	const rate = 16 << 10
	clock := newFakeClock()
	l := New(0, rate, nil, clock)
	s := &spy{Conn: tcpPair(t), clock: clock}
	c := l.Wrap("b", s)
	d := clock.Now().Add(time.Hour)
	if err := c.SetWriteDeadline(d); err != nil {
		t.Fatal(err)
	}
	write(t, c, 3*MinBurst) // the bucket holds one chunk: two waits of 1 s
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.deadlines[len(s.deadlines)-1]
	if want := d.Add(2 * time.Second); !got.Equal(want) {
		t.Fatalf("deadline %v, want %v (set %v plus 2 s waited)", got, want, d)
	}
}

// TestPastDeadlineInterruptsWait: a deadline in the past (how the wire
// layer cancels) and Close end a write blocked on tokens at once, and the
// tokens go back to the bucket.
func TestPastDeadlineInterruptsWait(t *testing.T) {
	for _, how := range []string{"deadline", "close"} {
		t.Run(how, func(t *testing.T) {
			const rate = 16 << 10
			clock := newFakeClock()
			l := New(0, rate, nil, clock)
			s := &spy{Conn: tcpPair(t), clock: clock}
			c := l.Wrap("b", s)
			write(t, c, MinBurst) // empties the bucket
			clock.mu.Lock()
			clock.block = true
			clock.mu.Unlock()
			errc := make(chan error, 1)
			go func() {
				_, err := c.Write(make([]byte, MinBurst))
				errc <- err
			}()
			if d := <-clock.waiting; d != time.Second {
				t.Fatalf("waits %v", d)
			}
			want := os.ErrDeadlineExceeded
			if how == "deadline" {
				c.SetDeadline(time.Unix(1, 0))
			} else {
				want = net.ErrClosed
				c.Close()
			}
			if err := <-errc; !errors.Is(err, want) {
				t.Fatalf("write = %v, want %v", err, want)
			}
			// The reservation was given back: one chunk again waits 1 s, not 2.
			r := l.buckets("b")[0].ReserveN(clock.Now(), MinBurst)
			if got := r.DelayFrom(clock.Now()); got != time.Second {
				t.Fatalf("after the interrupted wait a chunk waits %v", got)
			}
		})
	}
}

// TestPeerOverride: a peer's own rate replaces the per-peer default for it
// alone; with no default, only that peer is limited.
func TestPeerOverride(t *testing.T) {
	clock := newFakeClock()
	l := New(0, 64<<10, map[string]int64{"slow": 16 << 10}, clock)
	s := &spy{Conn: tcpPair(t), clock: clock}
	write(t, l.Wrap("slow", s), 128<<10)
	checkBound(t, s.log, 16<<10)
	if got, want := clock.Now().Sub(newFakeClock().now), time.Duration(float64(128<<10-Burst(16<<10))/(16<<10)*float64(time.Second)); got != want {
		t.Fatalf("slow peer took %v, want %v", got, want)
	}
	only := New(0, 0, map[string]int64{"slow": 16 << 10}, newFakeClock())
	c := tcpPair(t)
	if only.Wrap("fast", c) != c || only.Wrap("slow", c) == c {
		t.Fatal("an override without a default limits the wrong peers")
	}
}
