package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

// writeCounter counts the writes that reach a dialled TCP connection
// (Config.WrapConn sits under the batching) while armed, and fails them
// with fail once failArmed is set.
type writeCounter struct {
	net.Conn
	mu        sync.Mutex
	armed     bool
	writes    int
	fail      error
	failArmed bool
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.armed {
		w.writes++
		if w.failArmed {
			w.mu.Unlock()
			return 0, w.fail
		}
	}
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *writeCounter) arm(fail bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.writes, w.failArmed = true, 0, fail
}

func (w *writeCounter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

// dialCounted connects b to a with every socket write of b's side
// counted; it returns both ends.
func dialCounted(t *testing.T) (*wire.Conn, *wire.Conn, *writeCounter) {
	t.Helper()
	dir := pkitest.New(t, "a", "b")
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, nil))
	wc := &writeCounter{fail: errors.New("injected write failure")}
	cli := newTransport(t, dir, "b", []string{"a"}, func(c *Config) {
		c.WrapConn = func(_ string, raw net.Conn) net.Conn { wc.Conn = raw; return wc }
	})
	accepted := acceptAsync(srv)
	c, err := cli.Dial(context.Background(), srv.Addr().String(), "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() { res.conn.Close() })
	return c, res.conn, wc
}

// TestLargeSegmentLeavesInBatches: crypto/tls writes every record of at
// most 16 KiB on its own, 64 socket writes for 1 MiB; the batching under
// TLS sends a large SEGMENT in writes of 256 KiB, and the bytes arrive
// intact.
func TestLargeSegmentLeavesInBatches(t *testing.T) {
	ctx := context.Background()
	c, peer, wc := dialCounted(t)
	data := make([]byte, 1<<20+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	sum := sha256.Sum256(data)
	o := wire.Offer{SegmentID: "big", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	got := make(chan []byte, 1)
	go func() {
		o, err := peer.RecvOffer(ctx)
		var b bytes.Buffer
		if err == nil {
			err = peer.RecvSegment(ctx, o, &b) // checks the digest
		}
		if err == nil {
			err = peer.SendAck(ctx, o.SegmentID)
		}
		if err != nil {
			t.Error(err)
		}
		got <- b.Bytes()
	}()
	wc.arm(false)
	if err := c.Deliver(ctx, o, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatalf("received %d bytes, differing from the %d sent", len(b), len(data))
	}
	// The OFFER, then 1 MiB + TLS overhead in 256 KiB batches: 1 + 5.
	if n := wc.count(); n > 6 {
		t.Fatalf("%d socket writes for the OFFER and a 1 MiB SEGMENT, want at most 6", n)
	}
}

// TestBatchWriteErrorBreaksSend: a socket write that fails while a
// SEGMENT is batched fails SendSegment with that error, and the write side
// is then out of step.
func TestBatchWriteErrorBreaksSend(t *testing.T) {
	ctx := context.Background()
	c, _, wc := dialCounted(t)
	data := make([]byte, 1<<20)
	o := wire.Offer{SegmentID: "big", Size: int64(len(data)), SHA256: hex.EncodeToString(make([]byte, 32))}
	if err := c.SendOffer(ctx, o); err != nil {
		t.Fatal(err)
	}
	wc.arm(true)
	err := c.SendSegment(ctx, o, bytes.NewReader(data))
	if !errors.Is(err, wc.fail) {
		t.Fatalf("SendSegment = %v, want the injected write failure", err)
	}
	if err := c.SendAck(ctx, "x"); !errors.Is(err, wire.ErrBroken) {
		t.Fatalf("SendAck after a failed SEGMENT = %v, want ErrBroken", err)
	}
}

// TestBatchConnFlushOrder: over a real TCP pair, writes outside a hold go
// straight out, held writes follow them in order at Flush, and a Flush
// whose write fails reports it, as does every later Write.
func TestBatchConnFlushOrder(t *testing.T) {
	ln := mustListen(t)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	bc := newBatchConn(raw)
	defer bc.Close()

	big := bytes.Repeat([]byte("x"), batchSize+10) // one full batch goes out before Flush
	for _, p := range [][]byte{[]byte("direct,"), nil, []byte("held,"), big, []byte("end")} {
		if p == nil {
			bc.HoldWrites()
			continue
		}
		if n, err := bc.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if err := bc.Flush(); err != nil {
		t.Fatal(err)
	}
	want := append([]byte("direct,held,"), append(big, "end"...)...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes arrived out of order or changed")
	}

	bc.HoldWrites()
	if _, err := bc.Write([]byte("lost")); err != nil {
		t.Fatal(err) // buffered: nothing written yet
	}
	raw.Close()
	if err := bc.Flush(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Flush on a closed connection = %v, want net.ErrClosed", err)
	}
	if _, err := bc.Write([]byte("more")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after a failed Flush = %v, want net.ErrClosed", err)
	}
}
