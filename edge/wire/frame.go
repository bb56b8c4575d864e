package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Protocol versions. Version is the highest this package speaks; a
// connection runs the version both ends negotiated during the TLS
// handshake (ALPN, see docs/wire.md), and HELLO repeats it.
const (
	// Version1 is stop-and-wait: OFFER, SEGMENT, then ACK or NACK.
	Version1 = 1
	// Version2 pipelines: up to the receiver's window of offers in flight,
	// each answered ACCEPT (send it), ACK (already held) or NACK before
	// any segment byte moves, small segments pushed with their bytes
	// unasked (PUSH), and replies matched by segment id.
	Version2 = 2
	// Version3 is version 2 and WANT: a node that lost segments it had
	// acknowledged (it found its copies damaged) asks a peer that holds
	// them to send them again.
	Version3 = 3
	// Version4 is version 3 and NACK evicted: a receiver that took a
	// segment down for a takedown refuses it for good, and the sender
	// stops. Nothing else changes; the code needs a version of its own
	// because a version 3 decoder refuses a NACK with an unknown code as a
	// malformed message (docs/wire.md).
	Version4 = 4
	// Version5 is version 4 and NACK busy: a receiver that is still
	// taking in another copy of the offered segment (from another peer,
	// or the sender's own earlier attempt) says so, and the sender
	// postpones the offer with its retry budget untouched. Older peers
	// are told quota instead (NackFor).
	Version5 = 5
	// Version is the highest version spoken here.
	Version = Version5
)

// ALPNProtocols returns the TLS application protocol names that offer
// versions 2..max, highest first. Version 1 predates negotiation: a peer
// that offers or selects no protocol speaks version 1, and agents that
// speak only version 1 ignore the names (TLS servers without protocols of
// their own skip negotiation), so offering them is always safe.
func ALPNProtocols(max int) []string {
	var out []string
	for v := min(max, Version); v >= Version2; v-- {
		out = append(out, fmt.Sprintf("relay/%d", v))
	}
	return out
}

// NegotiatedVersion maps the TLS handshake's negotiated protocol to a
// version: "" (none) is version 1.
func NegotiatedVersion(alpn string) (int, error) {
	if alpn == "" {
		return Version1, nil
	}
	for v := Version2; v <= Version; v++ {
		if alpn == fmt.Sprintf("relay/%d", v) {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: application protocol %q", ErrVersion, alpn)
}

// Type is a frame's first byte.
type Type uint8

// Frame types. Payload layouts are the contract in docs/wire.md.
const (
	// TypeHello: JSON {"version":1,"node_id":"<node id>"}. The first frame
	// each way on a connection; node_id must equal the node id in the
	// sender's TLS certificate.
	TypeHello Type = 0x01
	// TypeOffer: JSON {"segment_id":"<id>","size":<bytes>,"sha256":"<64
	// lowercase hex>"}. Announces the SEGMENT frame that follows it.
	TypeOffer Type = 0x02
	// TypeSegment: the raw segment bytes; length equals the offer's size.
	TypeSegment Type = 0x03
	// TypeAck: the segment id as raw bytes (not JSON). Sent only after the
	// segment is durably stored, or already was with the same digest.
	TypeAck Type = 0x04
	// TypeNack: JSON {"segment_id":"<id or empty>","code":"<code>",
	// "message":"<text>"}. segment_id is empty only when the offer itself
	// could not be decoded.
	TypeNack Type = 0x05
	// TypeAccept (version 2 only): the segment id as raw bytes. The
	// receiver wants the offered segment: the sender sends its SEGMENT.
	// SEGMENT frames follow in the order of the ACCEPTs.
	TypeAccept Type = 0x06
	// TypeQuery (version 2 only): JSON {"segments":[<offer>,...]}, at
	// most MaxQuerySegments offers. The sender asks which of these
	// segments the receiver already holds, before offering any; sent only
	// while no offer is unanswered.
	TypeQuery Type = 0x07
	// TypeHolds (version 2 only): JSON {"segments":[<offer>,...]}, the
	// reply to a QUERY: the queried segments the receiver durably holds
	// with exactly that size and digest. It is the receiver's durable
	// claim, as an ACK is, for exactly the ids and digests it names.
	TypeHolds Type = 0x08
	// TypePush (version 2 only): JSON as OFFER, for a segment of at most
	// MaxPushSize bytes whose SEGMENT frame follows at once, without
	// waiting for an ACCEPT. It saves the ACCEPT round trip that would
	// otherwise cost a small segment more than its bytes do; the receiver
	// reads the SEGMENT even when it declines the segment (ACK when held,
	// NACK when refused), so the stream stays in step.
	TypePush Type = 0x09
	// TypeWant (version 3 only): JSON {"segments":[<offer>,...]}, at most
	// MaxQuerySegments offers, from the dialling side while no offer is
	// unanswered. The sender lost these segments after acknowledging them
	// and asks to be sent them again; the reply is a HOLDS naming those
	// the receiver holds with exactly that size and digest and has
	// scheduled to send back.
	TypeWant Type = 0x0A
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "HELLO"
	case TypeOffer:
		return "OFFER"
	case TypeSegment:
		return "SEGMENT"
	case TypeAck:
		return "ACK"
	case TypeNack:
		return "NACK"
	case TypeAccept:
		return "ACCEPT"
	case TypeQuery:
		return "QUERY"
	case TypeHolds:
		return "HOLDS"
	case TypePush:
		return "PUSH"
	case TypeWant:
		return "WANT"
	}
	return fmt.Sprintf("type(0x%02x)", uint8(t))
}

// Known reports whether t is one of the defined frame types (ACCEPT,
// QUERY, HOLDS and PUSH are defined from version 2, WANT from version 3;
// on an older connection they are unexpected frames).
func (t Type) Known() bool { return t >= TypeHello && t <= TypeWant }

const (
	// HeaderLen is the size of a frame header: type and length.
	HeaderLen = 5

	// MaxControlPayload bounds the payload of HELLO, OFFER, ACK, NACK and
	// ACCEPT.
	// The largest valid message (a NACK whose 1 KiB message is all
	// characters JSON escapes as \u00XX, plus a 128-byte id) stays well
	// below it.
	MaxControlPayload = 16 << 10

	// MaxQueryPayload bounds QUERY, WANT and HOLDS payloads: MaxQuerySegments
	// offers of the longest ids fit.
	MaxQueryPayload = 1 << 20

	// MaxPushSize bounds the segment of a PUSH. Up to this size sending
	// the bytes unasked costs less than the ACCEPT round trip (64 KiB is
	// 5 ms at 100 Mbit/s, a round trip on a device's link 50-300 ms), and
	// a receiver can hold a window of them in memory. Larger segments
	// are OFFERed, so a receiver that already holds one is never sent it.
	MaxPushSize = 64 << 10

	// MaxSegmentSize is the largest segment the length field can carry.
	MaxSegmentSize = math.MaxUint32
)

// Header is a decoded frame header.
type Header struct {
	Type   Type
	Length uint32
}

// Frame is a control frame read whole.
type Frame struct {
	Type    Type
	Payload []byte
}

// ReadHeader reads one frame header and checks the type. A clean end of
// stream before the first byte is io.EOF (the peer closed between frames);
// an end inside the header is io.ErrUnexpectedEOF, wrapped.
func ReadHeader(r io.Reader) (Header, error) {
	var b [HeaderLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return Header{}, io.EOF
		}
		return Header{}, fmt.Errorf("read frame header: %w", err)
	}
	h := Header{Type: Type(b[0]), Length: binary.BigEndian.Uint32(b[1:])}
	if !h.Type.Known() {
		return h, fmt.Errorf("read frame header: %w 0x%02x (length %d)", ErrUnknownType, b[0], h.Length)
	}
	return h, nil
}

// ReadFrame reads one whole frame whose payload is at most limit bytes. The
// length is checked against limit before any payload byte is allocated or
// read. Errors: io.EOF (clean end before the frame), ErrUnknownType,
// ErrFrameTooLarge, and io.ErrUnexpectedEOF wrapped for a truncated frame.
func ReadFrame(r io.Reader, limit uint32) (Frame, error) {
	h, err := ReadHeader(r)
	if err != nil {
		return Frame{}, err
	}
	if h.Length > limit {
		return Frame{}, fmt.Errorf("read %s frame: %w: %d bytes, limit %d", h.Type, ErrFrameTooLarge, h.Length, limit)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, fmt.Errorf("read %s frame payload: %w", h.Type, err)
	}
	return Frame{Type: h.Type, Payload: p}, nil
}

// AppendFrame appends the encoding of one frame to b.
func AppendFrame(b []byte, t Type, payload []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// WriteFrame writes one frame with a single Write call, so on TLS it goes
// out as one record. The payload must fit the length field.
func WriteFrame(w io.Writer, t Type, payload []byte) error {
	if uint64(len(payload)) > MaxSegmentSize {
		return fmt.Errorf("write %s frame: %w: %d bytes", t, ErrFrameTooLarge, len(payload))
	}
	if _, err := w.Write(AppendFrame(make([]byte, 0, HeaderLen+len(payload)), t, payload)); err != nil {
		return fmt.Errorf("write %s frame: %w", t, err)
	}
	return nil
}

// segmentChunk is the copy buffer for segment payloads: large enough to
// amortise per-call overhead, small enough to keep memory flat.
const segmentChunk = 64 << 10

// WriteSegment writes a SEGMENT frame of exactly size bytes taken from src,
// streaming in 64 KiB chunks. If src ends before size bytes the frame is
// incomplete and the stream cannot be continued; the error wraps ErrSource
// and io.ErrUnexpectedEOF. Bytes src holds beyond size are not read.
func WriteSegment(w io.Writer, size int64, src io.Reader) error {
	_, err := writeSegment(w, size, src, nil)
	return err
}

// writeSegment is WriteSegment with a hook run before each Write (Conn uses
// it to renew the idle deadline). It returns how many payload bytes were
// written so the caller knows whether the stream is still in step.
func writeSegment(w io.Writer, size int64, src io.Reader, beforeWrite func()) (int64, error) {
	if size < 0 || size > MaxSegmentSize {
		return 0, fmt.Errorf("write SEGMENT frame: %w: size %d outside 0..%d", ErrFrameTooLarge, size, int64(MaxSegmentSize))
	}
	buf := make([]byte, HeaderLen+int(min(size, segmentChunk)))
	buf[0] = byte(TypeSegment)
	binary.BigEndian.PutUint32(buf[1:HeaderLen], uint32(size))
	// The first chunk shares the buffer with the header so small segments
	// leave in one Write.
	chunk := buf[HeaderLen:]
	var sent int64
	start := 0
	for {
		n, err := io.ReadFull(src, chunk[:min(int64(len(chunk)), size-sent)])
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return sent, fmt.Errorf("write SEGMENT frame: %w: ended after %d of %d bytes: %w", ErrSource, sent+int64(n), size, io.ErrUnexpectedEOF)
			}
			return sent, fmt.Errorf("write SEGMENT frame: %w: %w", ErrSource, err)
		}
		if beforeWrite != nil {
			beforeWrite()
		}
		if _, err := w.Write(buf[start : HeaderLen+n]); err != nil {
			return sent, fmt.Errorf("write SEGMENT frame: %w", err)
		}
		sent += int64(n)
		start = HeaderLen // the header went out with the first chunk
		if sent == size {
			return sent, nil
		}
	}
}

// PayloadReader returns a reader that yields exactly the n payload bytes of
// a frame whose header was just read from r, then io.EOF. If r ends early it
// returns io.ErrUnexpectedEOF. It holds no buffer of its own.
func PayloadReader(r io.Reader, n uint32) io.Reader {
	return &payloadReader{r: r, left: int64(n)}
}

type payloadReader struct {
	r    io.Reader
	left int64
}

func (p *payloadReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, err := p.r.Read(b)
	p.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if p.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	return n, err
}
