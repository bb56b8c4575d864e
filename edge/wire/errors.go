package wire

import (
	"errors"
	"fmt"
	"io"
	"syscall"
)

// Sentinel errors. Functions wrap them with the operation and detail; test
// with errors.Is.
var (
	// ErrFrameTooLarge: a frame's length field exceeds the receiver's limit.
	// Nothing of the payload was read, so the stream is out of step and the
	// connection must be closed.
	ErrFrameTooLarge = errors.New("frame too large")

	// ErrUnknownType: a frame's type byte is not one of the five defined
	// types. The payload was not read; close the connection.
	ErrUnknownType = errors.New("unknown frame type")

	// ErrUnexpectedFrame: a defined frame type arrived where the exchange
	// does not allow it (for example SEGMENT where an OFFER was due).
	ErrUnexpectedFrame = errors.New("unexpected frame")

	// ErrBadMessage: a control frame's payload failed strict decoding or
	// validation. The whole frame was consumed, so a receiver may still
	// answer NACK bad_request on the same connection.
	ErrBadMessage = errors.New("bad message")

	// ErrInvalidID: a segment or node id breaks the identifier rules
	// (CheckSegmentID, CheckNodeID). Inside a received message it is also
	// ErrBadMessage.
	ErrInvalidID = errors.New("invalid identifier")

	// ErrVersion: the peer's HELLO names a protocol version this side does
	// not speak.
	ErrVersion = errors.New("unsupported protocol version")

	// ErrWindow: a version 2 peer sent an OFFER while the receiver's
	// window (its HELLO) was already full of unanswered offers.
	ErrWindow = errors.New("offer beyond the window")

	// ErrSizeMismatch: a SEGMENT frame's length differs from the size its
	// OFFER announced. The payload was not read.
	ErrSizeMismatch = errors.New("segment length differs from offer")

	// ErrChecksum: the received segment's SHA-256 differs from the offer.
	// The whole frame was consumed; the receiver answers NACK checksum and
	// must discard what it wrote.
	ErrChecksum = errors.New("segment checksum mismatch")

	// ErrAckMismatch: an ACK or NACK names a segment other than the one
	// being sent. It counts as a failed attempt (docs/wire.md).
	ErrAckMismatch = errors.New("reply names another segment")

	// ErrSource: reading the local segment source failed, or it ended
	// before the offered size, while sending a SEGMENT. It is a local
	// fault, not the peer's; the frame is incomplete, so close the
	// connection.
	ErrSource = errors.New("segment source failed")

	// ErrBroken: an earlier failure left this direction of the Conn in the
	// middle of a frame, so further frames cannot be delimited. Reads and
	// writes break independently: after a failed read a receiver can still
	// send its NACK.
	ErrBroken = errors.New("connection out of step after earlier error")
)

// NackError is returned by Conn.RecvAck when the peer refused the segment.
type NackError struct {
	Nack Nack
}

func (e *NackError) Error() string {
	if e.Nack.Message == "" {
		return fmt.Sprintf("peer refused segment %q: %s", e.Nack.SegmentID, e.Nack.Code)
	}
	return fmt.Sprintf("peer refused segment %q: %s: %s", e.Nack.SegmentID, e.Nack.Code, e.Nack.Message)
}

// Reasons ProtocolViolation returns, for a receiver's metrics and logs.
const (
	ReasonUnknownType     = "unknown_type"     // ErrUnknownType
	ReasonTooLarge        = "too_large"        // ErrFrameTooLarge
	ReasonUnexpectedFrame = "unexpected_frame" // ErrUnexpectedFrame
	ReasonSizeMismatch    = "size_mismatch"    // ErrSizeMismatch
	ReasonBadMessage      = "bad_message"      // ErrBadMessage (includes ErrInvalidID)
	ReasonVersion         = "version"          // ErrVersion
	ReasonWindow          = "window"           // ErrWindow
)

// ProtocolViolation reports whether err is the peer breaking the protocol
// (a frame this side must not receive), and names the reason. An
// authenticated peer that does so runs broken or hostile software, which
// an operator must hear about; a stream that merely ends (PeerAborted), a
// timeout or a local failure is not a violation.
func ProtocolViolation(err error) (reason string, ok bool) {
	for _, c := range []struct {
		err    error
		reason string
	}{
		{ErrUnknownType, ReasonUnknownType},
		{ErrFrameTooLarge, ReasonTooLarge},
		{ErrUnexpectedFrame, ReasonUnexpectedFrame},
		{ErrSizeMismatch, ReasonSizeMismatch},
		{ErrBadMessage, ReasonBadMessage},
		{ErrVersion, ReasonVersion},
		{ErrWindow, ReasonWindow},
	} {
		if errors.Is(err, c.err) {
			return c.reason, true
		}
	}
	return "", false
}

// PeerAborted reports whether err means the peer went away in the middle
// of a frame: the stream ended early (io.ErrUnexpectedEOF, or io.EOF where
// a frame was promised) or the connection was reset. A sender that crashes
// or is killed mid-segment looks like this to its receiver; it is the
// sender's failure, not the receiver's.
func PeerAborted(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
