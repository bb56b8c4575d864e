package wire

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Options tune a Conn. The zero value is usable.
type Options struct {
	// MaxSegmentSize makes RecvSegment and DiscardSegment refuse, before
	// reading a byte, a segment larger than this. Zero means
	// MaxSegmentSize, the most the length field can express. Receivers
	// normally also NACK too_large offers themselves, from their quota.
	MaxSegmentSize int64
	// IdleTimeout bounds every single read and write on the connection,
	// including the wait for the next frame; it is renewed on progress, so
	// a 64 MiB segment may take longer in total as long as bytes keep
	// flowing. Zero means no idle limit (only the context's deadline).
	IdleTimeout time.Duration
	// Version is the protocol version negotiated for this connection
	// (package transport sets it from the TLS handshake); zero means
	// Version1.
	Version int
	// Window is how many offers this side accepts unanswered as a
	// receiver on a version 2 connection, announced in its HELLO; zero
	// means DefaultWindow. At most MaxWindow.
	Window int
	// Hold, when set, is asked before a version 2 receiver reads a
	// QUERY's payload for the memory the exchange takes (QueryMemory of
	// the frame's length: the frame, what it decodes to and the HOLDS
	// answer) and returns once the receiver may hold it: a budget shared
	// by every connection of the process, so that many connections
	// querying at once wait their turn instead of multiplying the heap.
	// The Conn calls release once the HOLDS went out (SendHolds), the
	// QUERY failed, or the Conn is closed. nil: no bound besides
	// MaxQueryPayload per connection.
	Hold func(ctx context.Context, n int64) (release func(), err error)
}

// QueryMemory is what Options.Hold is asked for a QUERY of n payload
// bytes: the payload, the offers it decodes to (about as large again) and
// the encoded HOLDS (at most as large), measured on 4096-entry queries.
func QueryMemory(n int) int64 { return 3 * int64(n) }

// DefaultWindow is the receive window announced when Options.Window is
// zero. At 4 KiB segments and a 100 ms round trip, a window holds a
// slot for about two round trips (offer → accept, segment → ack), so
// 256 keeps about 5 MB/s moving on one connection; larger segments need
// fewer.
const DefaultWindow = 256

// Conn runs the exchange of docs/wire.md over one connection (normally an
// authenticated *tls.Conn from package transport).
//
// Every method takes a context: its deadline becomes the connection's
// deadline for that direction and its cancellation interrupts blocked I/O.
// A timeout shows as an error matching os.ErrDeadlineExceeded or the
// context's error.
//
// Reads and writes are independent: one goroutine may read while others
// write. Writes are serialised (each frame goes out whole), so several
// goroutines may send replies at once; reads must come from one goroutine
// at a time. After an error in the middle of a frame the affected
// direction is out of step and further calls in that direction return
// ErrBroken; errors that leave the stream in step (ErrBadMessage,
// ErrVersion, ErrChecksum, ErrAckMismatch, a NACK) do not, so a receiver
// can still send NACK after a failed read.
type Conn struct {
	nc  net.Conn
	opt Options

	wmu sync.Mutex // serialises write operations (whole frames)

	rerr error // first error that left the read side out of step; reader only
	werr error // same for the write side; under wmu

	peerWindow int // from the peer's HELLO (1 on version 1)

	// mu guards the deadline state shared with the contexts' AfterFuncs,
	// and the version 2 receiver state.
	mu      sync.Mutex
	rd, wr  direction
	written int64 // bytes handed to nc.Write, to detect partial frames
	// Version 2 receiver state: offers received and not yet answered
	// with ACK or NACK, and the accepted ones whose SEGMENT is due, in
	// ACCEPT order.
	open     map[string]bool
	accepted []Offer
	payload  *payloadReader // SEGMENT payload RecvRequest left to read
	// release gives back the memory Options.Hold granted for the QUERY
	// being answered; nil when none is held.
	release func()
}

// direction is one direction's current operation.
type direction struct {
	gen        uint64    // current operation; stale AfterFuncs compare it
	canceled   bool      // the current operation's context is done
	opDeadline time.Time // the current operation's context deadline
}

// NewConn wraps nc. The Conn owns nc from now on: Close closes it.
func NewConn(nc net.Conn, opt Options) *Conn {
	if opt.MaxSegmentSize <= 0 || opt.MaxSegmentSize > MaxSegmentSize {
		opt.MaxSegmentSize = MaxSegmentSize
	}
	if opt.Version < Version1 {
		opt.Version = Version1
	}
	if opt.Window <= 0 {
		opt.Window = DefaultWindow
	}
	opt.Window = min(opt.Window, MaxWindow)
	return &Conn{nc: nc, opt: opt, peerWindow: 1, open: map[string]bool{}}
}

// NetConn returns the underlying connection, e.g. to inspect TLS state.
func (c *Conn) NetConn() net.Conn { return c.nc }

// RemoteAddr is the peer's network address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Version is the protocol version the connection runs.
func (c *Conn) Version() int { return c.opt.Version }

// PeerWindow is how many offers the peer accepts unanswered: its HELLO's
// window on version 2, 1 on version 1 (stop-and-wait). Valid after
// RecvHello.
func (c *Conn) PeerWindow() int { return c.peerWindow }

// Close closes the underlying connection; blocked calls return.
func (c *Conn) Close() error {
	c.releaseQuery()
	return c.nc.Close()
}

// releaseQuery gives back the memory held for a QUERY, if any.
func (c *Conn) releaseQuery() {
	c.mu.Lock()
	release := c.release
	c.release = nil
	c.mu.Unlock()
	if release != nil {
		release()
	}
}

// aLongTimeAgo is a deadline in the past: it makes blocked I/O return now.
var aLongTimeAgo = time.Unix(1, 0)

// dirRead and dirWrite select a direction.
const (
	dirRead  = false
	dirWrite = true
)

func (c *Conn) dir(write bool) *direction {
	if write {
		return &c.wr
	}
	return &c.rd
}

func (c *Conn) setDeadline(write bool, t time.Time) {
	if write {
		_ = c.nc.SetWriteDeadline(t)
	} else {
		_ = c.nc.SetReadDeadline(t)
	}
}

// op runs f as one operation in one direction under ctx. It arranges for
// cancellation to interrupt f's I/O in that direction and for stale
// cancellations of earlier operations to be ignored.
func (c *Conn) op(ctx context.Context, write bool, name string, f func() error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.mu.Lock()
	d := c.dir(write)
	d.gen++
	g := d.gen
	d.canceled = false
	d.opDeadline, _ = ctx.Deadline()
	c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if d.gen == g {
			d.canceled = true
			c.setDeadline(write, aLongTimeAgo)
		}
	})
	err := f()
	stop()
	c.mu.Lock()
	d.gen++ // retire g: a late AfterFunc must not touch the next operation
	c.mu.Unlock()
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s: %w: %w", name, cerr, err)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// arm sets the deadline for the next single read or write.
func (c *Conn) arm(write bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dir(write)
	if d.canceled {
		return // the deadline is already in the past
	}
	t := d.opDeadline
	if c.opt.IdleTimeout > 0 {
		if idle := time.Now().Add(c.opt.IdleTimeout); t.IsZero() || idle.Before(t) {
			t = idle
		}
	}
	c.setDeadline(write, t)
}

// reader and writer apply arm before every call on nc.
type connReader struct{ c *Conn }

func (r connReader) Read(p []byte) (int, error) {
	r.c.arm(dirRead)
	return r.c.nc.Read(p)
}

type connWriter struct{ c *Conn }

func (w connWriter) Write(p []byte) (int, error) {
	w.c.arm(dirWrite)
	n, err := w.c.nc.Write(p)
	w.c.mu.Lock()
	w.c.written += int64(n)
	w.c.mu.Unlock()
	return n, err
}

func (c *Conn) wrote() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

// send runs one write operation; an error after some bytes went out
// breaks the write side.
func (c *Conn) send(ctx context.Context, name string, f func(w io.Writer) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.sendLocked(ctx, name, f)
}

func (c *Conn) sendLocked(ctx context.Context, name string, f func(w io.Writer) error) error {
	if c.werr != nil {
		return fmt.Errorf("%s: %w (%v)", name, ErrBroken, c.werr)
	}
	before := c.wrote()
	err := c.op(ctx, dirWrite, name, func() error { return f(connWriter{c}) })
	if err != nil && c.wrote() != before {
		c.werr = err
	}
	return err
}

// recv runs one read operation. f reports whether its error left the
// stream in step (the whole frame was consumed).
func (c *Conn) recv(ctx context.Context, name string, f func(r io.Reader) (inStep bool, err error)) error {
	if c.rerr != nil {
		return fmt.Errorf("%s: %w (%v)", name, ErrBroken, c.rerr)
	}
	inStep := true
	err := c.op(ctx, dirRead, name, func() error {
		var err error
		inStep, err = f(connReader{c})
		return err
	})
	if err != nil && !inStep {
		c.rerr = err
	}
	return err
}

// readControl reads one control frame of the wanted types. Any framing
// error, or a frame of another type, leaves the stream out of step.
func readControl(r io.Reader, want ...Type) (Frame, error) {
	f, err := ReadFrame(r, MaxControlPayload)
	if err != nil {
		return Frame{}, err
	}
	for _, t := range want {
		if f.Type == t {
			return f, nil
		}
	}
	return Frame{}, fmt.Errorf("%w: got %s, want %v", ErrUnexpectedFrame, f.Type, want)
}

func (c *Conn) sendControl(ctx context.Context, name string, t Type, payload []byte, encErr error) error {
	if encErr != nil {
		return fmt.Errorf("%s: %w", name, encErr)
	}
	return c.send(ctx, name, func(w io.Writer) error { return WriteFrame(w, t, payload) })
}

// SendHello sends HELLO with the connection's version, nodeID and, from
// version 2 on, the receive window (Options.Window).
func (c *Conn) SendHello(ctx context.Context, nodeID string) error {
	h := Hello{Version: c.opt.Version, NodeID: nodeID}
	if h.Version >= Version2 {
		h.Window = c.opt.Window
	}
	p, err := EncodeHello(h)
	return c.sendControl(ctx, "send hello", TypeHello, p, err)
}

// RecvHello reads the peer's HELLO. A version other than the connection's
// (Options.Version, as negotiated) is ErrVersion. Checking the node id
// against the certificate is the caller's job (package transport does it).
func (c *Conn) RecvHello(ctx context.Context) (Hello, error) {
	var h Hello
	err := c.recv(ctx, "recv hello", func(r io.Reader) (bool, error) {
		f, err := readControl(r, TypeHello)
		if err != nil {
			return false, err
		}
		if h, err = DecodeHello(f.Payload); err != nil {
			return true, err
		}
		if h.Version != c.opt.Version {
			return true, fmt.Errorf("%w: peer's HELLO says %d, the connection negotiated %d", ErrVersion, h.Version, c.opt.Version)
		}
		c.peerWindow = max(1, h.Window)
		return true, nil
	})
	return h, err
}

// SendOffer sends OFFER. The SEGMENT must follow at once (SendSegment).
func (c *Conn) SendOffer(ctx context.Context, o Offer) error {
	p, err := EncodeOffer(o)
	return c.sendControl(ctx, "send offer "+o.SegmentID, TypeOffer, p, err)
}

// RecvOffer waits for the next OFFER. When the peer closed the connection
// cleanly between exchanges the error matches io.EOF. An undecodable offer
// is ErrBadMessage; the receiver should answer NACK bad_request (with the
// segment id empty) and close, since it cannot vouch for the SEGMENT that
// follows.
func (c *Conn) RecvOffer(ctx context.Context) (Offer, error) {
	var o Offer
	err := c.recv(ctx, "recv offer", func(r io.Reader) (bool, error) {
		f, err := readControl(r, TypeOffer)
		if err != nil {
			return false, err
		}
		o, err = DecodeOffer(f.Payload)
		return true, err
	})
	return o, err
}

// SendSegment streams the SEGMENT frame for o: exactly o.Size bytes from
// src. The digest is not checked here; the receiver does that.
//
// Any error leaves the write side out of step, even one before the first
// byte: the peer has the OFFER and waits for its SEGMENT.
func (c *Conn) SendSegment(ctx context.Context, o Offer, src io.Reader) error {
	err := c.send(ctx, "send segment "+o.SegmentID, func(w io.Writer) error {
		b := c.batcher(o.Size)
		if b != nil {
			b.HoldWrites()
		}
		_, err := writeSegment(w, o.Size, src, nil)
		if b != nil {
			if ferr := b.Flush(); err == nil && ferr != nil {
				err = fmt.Errorf("write SEGMENT frame: %w", ferr)
			}
		}
		return err
	})
	if err != nil {
		c.wmu.Lock()
		if c.werr == nil {
			c.werr = err
		}
		c.wmu.Unlock()
	}
	return err
}

// writeBatcher is implemented by the connection under TLS that package
// transport installs: between HoldWrites and Flush it gathers TLS records
// into fewer, larger socket writes (crypto/tls writes every record of at
// most 16 KiB on its own).
type writeBatcher interface {
	HoldWrites()
	Flush() error
}

// batchFrom is the SEGMENT size from which SendSegment holds writes: a
// smaller frame is a handful of records, already written together.
const batchFrom = 4 * segmentChunk

// batcher returns the writeBatcher under c's TLS connection for a SEGMENT
// of size bytes, or nil.
func (c *Conn) batcher(size int64) writeBatcher {
	if size < batchFrom {
		return nil
	}
	tc, ok := c.nc.(interface{ NetConn() net.Conn })
	if !ok {
		return nil
	}
	b, _ := tc.NetConn().(writeBatcher)
	return b
}

// readSegmentHeader reads the SEGMENT header for o and checks its length.
func (c *Conn) readSegmentHeader(r io.Reader, o Offer) (Header, error) {
	if o.Size > c.opt.MaxSegmentSize {
		return Header{}, fmt.Errorf("%w: offer of %d bytes, limit %d", ErrFrameTooLarge, o.Size, c.opt.MaxSegmentSize)
	}
	return readSegmentHeaderOf(r, o)
}

// readSegmentHeaderOf reads the header of the SEGMENT frame that must
// follow o (an OFFER's in version 1, a PUSH's in version 2) and checks its
// type and length.
func readSegmentHeaderOf(r io.Reader, o Offer) (Header, error) {
	h, err := ReadHeader(r)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // an offer promised a segment
	}
	if err != nil {
		return h, err
	}
	if h.Type != TypeSegment {
		return h, fmt.Errorf("%w: got %s, want SEGMENT", ErrUnexpectedFrame, h.Type)
	}
	if int64(h.Length) != o.Size {
		return h, fmt.Errorf("%w: frame of %d bytes, offer of %d", ErrSizeMismatch, h.Length, o.Size)
	}
	return h, nil
}

// RecvSegment streams the SEGMENT frame announced by o into dst, hashing
// as it goes, and returns ErrChecksum if the digest differs from o.SHA256.
// dst has then received all the bytes; the caller must discard them. A
// short read, a write error from dst, a length other than o.Size or a size
// above Options.MaxSegmentSize leave the read side out of step.
func (c *Conn) RecvSegment(ctx context.Context, o Offer, dst io.Writer) error {
	return c.recv(ctx, "recv segment "+o.SegmentID, func(r io.Reader) (bool, error) {
		h, err := c.readSegmentHeader(r, o)
		if err != nil {
			return false, err
		}
		sum := sha256.New()
		buf := make([]byte, segmentChunk)
		if _, err := io.CopyBuffer(io.MultiWriter(dst, sum), PayloadReader(r, h.Length), buf); err != nil {
			return false, err
		}
		if got := hex.EncodeToString(sum.Sum(nil)); got != o.SHA256 {
			return true, fmt.Errorf("%w: got sha256 %s, offer says %s", ErrChecksum, got, o.SHA256)
		}
		return true, nil
	})
}

// RecvSegmentPayload reads the SEGMENT frame announced by o (version 1:
// it follows the OFFER) and hands its payload to consume, which must read
// it to the end (io.EOF) or fail. Unlike RecvSegment it does not hash:
// consume verifies the digest (the segment store hashes while it writes,
// so hashing here too would cost a second SHA-256 of every byte). An
// error from consume is returned as it is; the read side stays in step
// if consume read the whole payload, as it does before reporting a
// digest mismatch. Header errors are those of RecvSegment.
func (c *Conn) RecvSegmentPayload(ctx context.Context, o Offer, consume func(io.Reader) error) error {
	return c.recv(ctx, "recv segment "+o.SegmentID, func(r io.Reader) (bool, error) {
		h, err := c.readSegmentHeader(r, o)
		if err != nil {
			return false, err
		}
		p := &payloadReader{r: r, left: int64(h.Length)}
		err = consume(p)
		if p.left > 0 {
			if err == nil {
				err = fmt.Errorf("segment %s: %d payload bytes left unread", o.SegmentID, p.left)
			}
			return false, err
		}
		return true, err
	})
}

// DiscardSegment reads and drops the SEGMENT frame announced by o, so a
// receiver that refused (NACK) or already holds the segment can keep the
// connection for the next exchange instead of closing it.
func (c *Conn) DiscardSegment(ctx context.Context, o Offer) error {
	return c.recv(ctx, "discard segment "+o.SegmentID, func(r io.Reader) (bool, error) {
		h, err := c.readSegmentHeader(r, o)
		if err != nil {
			return false, err
		}
		_, err = io.CopyBuffer(io.Discard, PayloadReader(r, h.Length), make([]byte, segmentChunk))
		return err == nil, err
	})
}

// SendAck acknowledges segmentID. Call it only once the segment is durably
// stored (or already was, with the same digest).
func (c *Conn) SendAck(ctx context.Context, segmentID string) error {
	c.answered(segmentID)
	return c.sendControl(ctx, "send ack "+segmentID, TypeAck, []byte(segmentID), badMessage(CheckSegmentID(segmentID)))
}

// SendNack refuses a segment. A message longer than MaxNackMessage is
// truncated rather than refused, so any error text can be sent.
func (c *Conn) SendNack(ctx context.Context, n Nack) error {
	n.Message = TruncateMessage(n.Message)
	c.answered(n.SegmentID)
	p, err := EncodeNack(n)
	return c.sendControl(ctx, "send nack "+n.SegmentID, TypeNack, p, err)
}

// RecvAckOrNack waits for the reply to segmentID: (nil, nil) for an ACK,
// (nack, nil) for a NACK naming segmentID or naming none. A reply for
// another segment is ErrAckMismatch.
func (c *Conn) RecvAckOrNack(ctx context.Context, segmentID string) (*Nack, error) {
	var nack *Nack
	err := c.recv(ctx, "recv ack "+segmentID, func(r io.Reader) (bool, error) {
		f, err := readControl(r, TypeAck, TypeNack)
		if err != nil {
			return false, err
		}
		if f.Type == TypeAck {
			id, err := DecodeAck(f.Payload)
			if err == nil && id != segmentID {
				err = fmt.Errorf("%w: ACK for %q", ErrAckMismatch, id)
			}
			return true, err
		}
		n, err := DecodeNack(f.Payload)
		if err == nil && n.SegmentID != "" && n.SegmentID != segmentID {
			err = fmt.Errorf("%w: NACK for %q", ErrAckMismatch, n.SegmentID)
		}
		if err == nil {
			nack = &n
		}
		return true, err
	})
	return nack, err
}

// RecvAck is RecvAckOrNack with a NACK turned into a *NackError.
func (c *Conn) RecvAck(ctx context.Context, segmentID string) error {
	n, err := c.RecvAckOrNack(ctx, segmentID)
	if err != nil {
		return err
	}
	if n != nil {
		return &NackError{Nack: *n}
	}
	return nil
}

// Deliver is the sender's whole exchange: OFFER, SEGMENT from src, then
// the reply. It returns nil only for a matching ACK; a NACK is *NackError.
// A receiver may NACK and close before reading the segment, which makes
// the segment write fail; Deliver then still tries to read the NACK so the
// caller learns the reason. Any error is a failed attempt.
func (c *Conn) Deliver(ctx context.Context, o Offer, src io.Reader) error {
	if err := c.SendOffer(ctx, o); err != nil {
		return err
	}
	if err := c.SendSegment(ctx, o, src); err != nil {
		if errors.Is(err, ErrSource) {
			return err // our fault; the receiver is still waiting for bytes
		}
		var ne *NackError
		if rerr := c.RecvAck(ctx, o.SegmentID); errors.As(rerr, &ne) {
			return fmt.Errorf("%w (segment write: %v)", ne, err)
		}
		return err
	}
	return c.RecvAck(ctx, o.SegmentID)
}
