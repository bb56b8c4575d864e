package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
)

// TestClassifyErrors: the errors the readers return for real bad input are
// named as violations with their reason, and a stream that ends mid-frame
// or is reset counts as the peer aborting, never as a violation.
func TestClassifyErrors(t *testing.T) {
	read := func(b []byte) error {
		_, err := ReadFrame(bytes.NewReader(b), MaxControlPayload)
		return err
	}
	for _, tc := range []struct {
		name    string
		err     error
		reason  string
		aborted bool
	}{
		{"unknown type", read([]byte{0x0b, 0, 0, 0, 0}), ReasonUnknownType, false},
		{"too large", read([]byte{byte(TypeOffer), 0, 1, 0, 0}), ReasonTooLarge, false},
		{"truncated payload", read([]byte{byte(TypeOffer), 0, 0, 0, 9, '{'}), "", true},
		{"truncated header", read([]byte{byte(TypeOffer), 0}), "", true},
		{"bad offer", func() error { _, err := DecodeOffer([]byte(`{}`)); return err }(), ReasonBadMessage, false},
		{"unexpected frame", fmt.Errorf("recv: %w", ErrUnexpectedFrame), ReasonUnexpectedFrame, false},
		{"size mismatch", fmt.Errorf("recv: %w", ErrSizeMismatch), ReasonSizeMismatch, false},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), "", true},
		{"checksum", fmt.Errorf("recv: %w", ErrChecksum), "", false},
		{"timeout", fmt.Errorf("recv: %w", errors.New("i/o timeout")), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, ok := ProtocolViolation(tc.err)
			if reason != tc.reason || ok != (tc.reason != "") {
				t.Errorf("ProtocolViolation(%v) = %q, %v; want %q", tc.err, reason, ok, tc.reason)
			}
			if got := PeerAborted(tc.err); got != tc.aborted {
				t.Errorf("PeerAborted(%v) = %v, want %v", tc.err, got, tc.aborted)
			}
		})
	}
	if !errors.Is(read(nil), io.EOF) || PeerAborted(nil) {
		t.Error("a clean end before a frame is io.EOF, and nil is no abort")
	}
}
