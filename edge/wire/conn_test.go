package wire

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// tcpPair returns two ends of a real loopback TCP connection, wrapped.
func tcpPair(t *testing.T, opt Options) (client, server *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("accept failed")
	}
	client, server = NewConn(nc, opt), NewConn(sc, opt)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func offerFor(id string, data []byte) Offer {
	sum := sha256.Sum256(data)
	return Offer{SegmentID: id, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
}

// goAsync runs f in a goroutine and returns its result channel.
func goAsync(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func TestConnHappyPathManyExchanges(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	segments := map[string][]byte{
		"s1":    []byte("first"),
		"empty": {},
		"big":   bytes.Repeat([]byte("0123456789abcdef"), 40000), // spans many chunks
	}
	order := []string{"s1", "empty", "big"}
	stored := map[string][]byte{}
	recvDone := goAsync(func() error {
		if err := rcv.SendHello(ctx, "receiver"); err != nil {
			return err
		}
		if h, err := rcv.RecvHello(ctx); err != nil || h.NodeID != "sender" {
			return errors.Join(err, errors.New("bad hello "+h.NodeID))
		}
		for {
			o, err := rcv.RecvOffer(ctx)
			if errors.Is(err, io.EOF) {
				return nil // sender closed between exchanges
			}
			if err != nil {
				return err
			}
			var b bytes.Buffer
			if err := rcv.RecvSegment(ctx, o, &b); err != nil {
				return err
			}
			stored[o.SegmentID] = b.Bytes()
			if err := rcv.SendAck(ctx, o.SegmentID); err != nil {
				return err
			}
		}
	})
	if err := snd.SendHello(ctx, "sender"); err != nil {
		t.Fatal(err)
	}
	if h, err := snd.RecvHello(ctx); err != nil || h != (Hello{Version: Version1, NodeID: "receiver"}) {
		t.Fatalf("RecvHello = %+v, %v", h, err)
	}
	for _, id := range order {
		data := segments[id]
		if err := snd.Deliver(ctx, offerFor(id, data), bytes.NewReader(data)); err != nil {
			t.Fatalf("deliver %s: %v", id, err)
		}
	}
	snd.Close()
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
	for _, id := range order {
		if !bytes.Equal(stored[id], segments[id]) {
			t.Errorf("segment %s: stored %d bytes, sent %d", id, len(stored[id]), len(segments[id]))
		}
	}
}

func TestConnChecksumMismatchKeepsConnection(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := []byte("payload")
	bad := offerFor("s1", data)
	bad.SHA256 = strings.Repeat("0", 64)
	recvDone := goAsync(func() error {
		for i := 0; i < 2; i++ {
			o, err := rcv.RecvOffer(ctx)
			if err != nil {
				return err
			}
			err = rcv.RecvSegment(ctx, o, io.Discard)
			if errors.Is(err, ErrChecksum) {
				if err := rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackChecksum, Message: err.Error()}); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			if err := rcv.SendAck(ctx, o.SegmentID); err != nil {
				return err
			}
		}
		return nil
	})
	err := snd.Deliver(ctx, bad, bytes.NewReader(data))
	var ne *NackError
	if !errors.As(err, &ne) || ne.Nack.Code != NackChecksum || ne.Nack.SegmentID != "s1" {
		t.Fatalf("deliver with bad digest: %v, want NACK checksum", err)
	}
	// The same connection still carries the next exchange.
	if err := snd.Deliver(ctx, offerFor("s2", data), bytes.NewReader(data)); err != nil {
		t.Fatalf("deliver after checksum NACK: %v", err)
	}
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
}

func TestConnIdempotentReAck(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := []byte("already here")
	o := offerFor("dup", data)
	recvDone := goAsync(func() error {
		for i := 0; i < 2; i++ {
			got, err := rcv.RecvOffer(ctx)
			if err != nil {
				return err
			}
			// A receiver that already holds the digest skips the bytes and
			// acknowledges again.
			if err := rcv.DiscardSegment(ctx, got); err != nil {
				return err
			}
			if err := rcv.SendAck(ctx, got.SegmentID); err != nil {
				return err
			}
		}
		return nil
	})
	for i := 0; i < 2; i++ {
		if err := snd.Deliver(ctx, o, bytes.NewReader(data)); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
}

// TestConnNackThenClose: a receiver refusing a large offer answers NACK and
// closes without reading the segment. The sender's segment write may fail;
// either way Deliver reports a failed attempt, and when the NACK made it
// through, the reason.
func TestConnNackThenClose(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := bytes.Repeat([]byte{7}, 8<<20) // more than socket buffers hold
	recvDone := goAsync(func() error {
		o, err := rcv.RecvOffer(ctx)
		if err != nil {
			return err
		}
		if err := rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackTooLarge, Message: "limit 1 MiB"}); err != nil {
			return err
		}
		return rcv.Close()
	})
	err := snd.Deliver(ctx, offerFor("huge", data), bytes.NewReader(data))
	if err == nil {
		t.Fatal("deliver succeeded against a refusing receiver")
	}
	var ne *NackError
	if errors.As(err, &ne) && ne.Nack.Code != NackTooLarge {
		t.Fatalf("NACK code %s, want too_large", ne.Nack.Code)
	}
	t.Logf("sender saw: %v", err)
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
}

func TestConnNackThenDiscardKeepsConnection(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := bytes.Repeat([]byte{1}, 3<<20)
	recvDone := goAsync(func() error {
		o, err := rcv.RecvOffer(ctx)
		if err != nil {
			return err
		}
		if err := rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackQuota}); err != nil {
			return err
		}
		if err := rcv.DiscardSegment(ctx, o); err != nil {
			return err
		}
		o, err = rcv.RecvOffer(ctx)
		if err != nil {
			return err
		}
		if err := rcv.RecvSegment(ctx, o, io.Discard); err != nil {
			return err
		}
		return rcv.SendAck(ctx, o.SegmentID)
	})
	var ne *NackError
	if err := snd.Deliver(ctx, offerFor("q1", data), bytes.NewReader(data)); !errors.As(err, &ne) || ne.Nack.Code != NackQuota {
		t.Fatalf("first delivery: %v, want NACK quota", err)
	}
	if err := snd.Deliver(ctx, offerFor("q2", data[:10]), bytes.NewReader(data[:10])); err != nil {
		t.Fatalf("second delivery on same connection: %v", err)
	}
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
}

// rawPeer writes raw frames on one side, to provoke every receive error.
func TestConnReceiveErrors(t *testing.T) {
	data := []byte("12345")
	good := offerFor("s1", data)
	ack := func(id string) []byte { return AppendFrame(nil, TypeAck, []byte(id)) }
	nack := func(n Nack) []byte {
		p, err := EncodeNack(n)
		if err != nil {
			t.Fatal(err)
		}
		return AppendFrame(nil, TypeNack, p)
	}
	for _, tc := range []struct {
		name   string
		raw    []byte
		op     func(ctx context.Context, c *Conn) error
		err    error
		broken bool // the read side must now refuse with ErrBroken
	}{
		{"ack for another segment", ack("s2"), func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrAckMismatch, false},
		{"nack for another segment", nack(Nack{SegmentID: "s2", Code: NackQuota}), func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrAckMismatch, false},
		{"malformed ack", ack("../x"), func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrBadMessage, false},
		{"offer where ack due", AppendFrame(nil, TypeOffer, []byte("{}")), func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrUnexpectedFrame, true},
		{"unknown frame type", []byte{0x0b, 0, 0, 0, 0}, func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrUnknownType, true},
		{"oversized control frame", []byte{0x04, 0, 1, 0, 0}, func(ctx context.Context, c *Conn) error { return c.RecvAck(ctx, "s1") }, ErrFrameTooLarge, true},
		{"bad offer json", AppendFrame(nil, TypeOffer, []byte(`{"segment_id":"s1"}`)), func(ctx context.Context, c *Conn) error { _, err := c.RecvOffer(ctx); return err }, ErrBadMessage, false},
		{"hello version above the negotiated one", AppendFrame(nil, TypeHello, []byte(`{"version":2,"node_id":"n","window":8}`)), func(ctx context.Context, c *Conn) error { _, err := c.RecvHello(ctx); return err }, ErrVersion, false},
		{"segment shorter than offer", AppendFrame(nil, TypeSegment, data[:4]), func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, ErrSizeMismatch, true},
		{"segment longer than offer", AppendFrame(nil, TypeSegment, append(data, '6')), func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, ErrSizeMismatch, true},
		{"ack where segment due", ack("s1"), func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, ErrUnexpectedFrame, true},
		{"segment bytes corrupted", AppendFrame(nil, TypeSegment, []byte("12346")), func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, ErrChecksum, false},
		{"truncated segment then close", AppendFrame(nil, TypeSegment, data)[:HeaderLen+2], func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, io.ErrUnexpectedEOF, true},
		{"close where segment due", nil, func(ctx context.Context, c *Conn) error { return c.RecvSegment(ctx, good, io.Discard) }, io.ErrUnexpectedEOF, true},
		{"clean close where offer due", nil, func(ctx context.Context, c *Conn) error { _, err := c.RecvOffer(ctx); return err }, io.EOF, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			peer, c := tcpPair(t, Options{})
			if _, err := peer.NetConn().Write(tc.raw); err != nil {
				t.Fatal(err)
			}
			if tc.raw == nil || tc.name == "truncated segment then close" {
				peer.Close()
			}
			err := tc.op(ctx, c)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error = %v, want %v", err, tc.err)
			}
			peer.Close() // an in-step read now sees a clean io.EOF
			_, again := c.RecvOffer(ctx)
			if tc.broken != errors.Is(again, ErrBroken) {
				t.Fatalf("after %v, next read: %v; want broken=%v", err, again, tc.broken)
			}
		})
	}
}

func TestConnRecvSegmentRefusesOverLimitBeforeReading(t *testing.T) {
	ctx := context.Background()
	peer, c := tcpPair(t, Options{MaxSegmentSize: 4})
	o := offerFor("s1", []byte("12345"))
	// Nothing is written by the peer: RecvSegment must refuse without
	// waiting for bytes.
	if err := c.RecvSegment(ctx, o, io.Discard); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("RecvSegment = %v, want ErrFrameTooLarge", err)
	}
	_ = peer
}

// failingWriter fails after n bytes, like a full disk.
type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		return 0, errors.New("no space left on device")
	}
	w.n -= len(p)
	return len(p), nil
}

func TestConnDestinationFailureBreaksReadsNotWrites(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := bytes.Repeat([]byte("x"), 1<<20)
	o := offerFor("s1", data)
	sent := goAsync(func() error { return snd.Deliver(ctx, o, bytes.NewReader(data)) })
	got, err := rcv.RecvOffer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.RecvSegment(ctx, got, &failingWriter{n: 1000}); err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("RecvSegment = %v, want destination error", err)
	}
	if _, err := rcv.RecvOffer(ctx); !errors.Is(err, ErrBroken) {
		t.Fatalf("read after mid-segment failure: %v, want ErrBroken", err)
	}
	// The write side is still in step: the receiver can say why.
	if err := rcv.SendNack(ctx, Nack{SegmentID: got.SegmentID, Code: NackInternal, Message: "disk full"}); err != nil {
		t.Fatalf("SendNack after read failure: %v", err)
	}
	rcv.Close()
	if err := <-sent; err == nil {
		t.Fatal("sender saw success")
	}
}

func TestConnSourceFailureIsLocal(t *testing.T) {
	ctx := context.Background()
	snd, _ := tcpPair(t, Options{})
	o := offerFor("s1", []byte("12345"))
	err := snd.Deliver(ctx, o, strings.NewReader("123"))
	if !errors.Is(err, ErrSource) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Deliver with short source = %v, want ErrSource", err)
	}
	if err := snd.SendAck(ctx, "s1"); !errors.Is(err, ErrBroken) {
		t.Fatalf("write after partial frame: %v, want ErrBroken", err)
	}
}

func TestConnSendRefusesInvalidWithoutBreaking(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	for name, err := range map[string]error{
		"ack":   snd.SendAck(ctx, "bad id"),
		"nack":  snd.SendNack(ctx, Nack{SegmentID: "s", Code: "later"}),
		"offer": snd.SendOffer(ctx, Offer{SegmentID: "s", Size: 1, SHA256: "xyz"}),
		"hello": snd.SendHello(ctx, ".node"),
	} {
		if !errors.Is(err, ErrBadMessage) {
			t.Errorf("send %s: %v, want ErrBadMessage", name, err)
		}
	}
	if err := snd.SendAck(ctx, "fine"); err != nil {
		t.Fatalf("valid send after refused ones: %v", err)
	}
	if err := rcv.RecvAck(ctx, "fine"); err != nil {
		t.Fatalf("receiver saw garbage before the valid frame: %v", err)
	}
}

func TestConnContextCancelInterruptsBlockedRead(t *testing.T) {
	_, rcv := tcpPair(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := goAsync(func() error { _, err := rcv.RecvOffer(ctx); return err })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("RecvOffer after cancel = %v, want context.Canceled", err)
	}
	// An expired context fails fast without touching the connection.
	if err := rcv.SendAck(ctx, "s1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("SendAck on canceled ctx = %v", err)
	}
}

func TestConnContextDeadlineIsLateAck(t *testing.T) {
	snd, rcv := tcpPair(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	data := []byte("no reply coming")
	o := offerFor("s1", data)
	// The receiver reads everything but never answers.
	go func() {
		o, _ := rcv.RecvOffer(context.Background())
		_ = rcv.RecvSegment(context.Background(), o, io.Discard)
	}()
	err := snd.Deliver(ctx, o, bytes.NewReader(data))
	if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Deliver without reply = %v, want a deadline error", err)
	}
}

func TestConnIdleTimeout(t *testing.T) {
	_, rcv := tcpPair(t, Options{IdleTimeout: 20 * time.Millisecond})
	_, err := rcv.RecvOffer(context.Background())
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("RecvOffer from a silent peer = %v, want os.ErrDeadlineExceeded", err)
	}
}

// TestConnStaleCancelDoesNotLeak: cancelling the context of a finished
// operation must not disturb the next one.
func TestConnStaleCancelDoesNotLeak(t *testing.T) {
	snd, rcv := tcpPair(t, Options{})
	ctx1, cancel1 := context.WithCancel(context.Background())
	if err := snd.SendAck(ctx1, "a"); err != nil {
		t.Fatal(err)
	}
	if err := rcv.RecvAck(ctx1, "a"); err != nil {
		t.Fatal(err)
	}
	cancel1()
	errc := goAsync(func() error { return rcv.RecvAck(context.Background(), "b") })
	if err := snd.SendAck(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("operation after a stale cancel: %v", err)
	}
}

// TestConnRecvSegmentPayload: the payload goes to consume unhashed (the
// consumer verifies); a consumer's error after reading the whole payload
// leaves the stream in step for the next exchange, one before its end
// breaks the read side.
func TestConnRecvSegmentPayload(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{})
	data := bytes.Repeat([]byte("p"), 300<<10)
	bad := offerFor("bad", data)
	bad.SHA256 = strings.Repeat("0", 64) // not checked here: consume does
	errRefused := errors.New("consumer refused")
	sent := goAsync(func() error {
		for _, o := range []Offer{bad, offerFor("s2", data)} {
			if err := snd.SendOffer(ctx, o); err != nil {
				return err
			}
			if err := snd.SendSegment(ctx, o, bytes.NewReader(data)); err != nil {
				return err
			}
		}
		return nil
	})
	for i, consume := range []func(io.Reader) error{
		func(r io.Reader) error { // reads all, then fails: in step
			b, err := io.ReadAll(r)
			if err == nil && !bytes.Equal(b, data) {
				err = errors.New("payload differs")
			}
			if err == nil {
				err = errRefused
			}
			return err
		},
		func(r io.Reader) error { // fails half way: out of step
			_, err := io.ReadFull(r, make([]byte, len(data)/2))
			if err == nil {
				err = errRefused
			}
			return err
		},
	} {
		o, err := rcv.RecvOffer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := rcv.RecvSegmentPayload(ctx, o, consume); !errors.Is(err, errRefused) {
			t.Fatalf("exchange %d: RecvSegmentPayload = %v, want the consumer's error", i, err)
		}
	}
	if _, err := rcv.RecvOffer(ctx); !errors.Is(err, ErrBroken) {
		t.Fatalf("read after a consumer stopped mid-payload = %v, want ErrBroken", err)
	}
	rcv.Close() // the rest of the second SEGMENT may not fit the socket buffers
	<-sent
}
