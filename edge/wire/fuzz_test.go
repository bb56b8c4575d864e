package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
)

// FuzzReadFrame: ReadFrame never panics, never returns more than the limit,
// consumes exactly header+payload on success, and what it returns encodes
// back to the bytes it consumed.
func FuzzReadFrame(f *testing.F) {
	seedFrames(f, false)
	f.Add([]byte{0x02, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		const limit = 64
		r := bytes.NewReader(data)
		fr, err := ReadFrame(r, limit)
		if err != nil {
			if !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrUnknownType) || errors.Is(err, ErrFrameTooLarge)) {
				t.Fatalf("unexpected error class: %v", err)
			}
			if errors.Is(err, ErrFrameTooLarge) && len(data)-r.Len() > HeaderLen {
				t.Fatalf("read %d bytes before refusing an oversized frame", len(data)-r.Len())
			}
			return
		}
		if len(fr.Payload) > limit || !fr.Type.Known() {
			t.Fatalf("accepted %v with %d bytes", fr.Type, len(fr.Payload))
		}
		consumed := len(data) - r.Len()
		if enc := AppendFrame(nil, fr.Type, fr.Payload); consumed != len(enc) || !bytes.Equal(enc, data[:consumed]) {
			t.Fatalf("re-encoding differs from the %d consumed bytes", consumed)
		}
	})
}

// FuzzDecodeOffer: a decoded offer is valid and survives an encode/decode
// round trip unchanged.
func FuzzDecodeOffer(f *testing.F) {
	seedFrames(f, true)
	f.Fuzz(func(t *testing.T, p []byte) {
		o, err := DecodeOffer(p)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		enc, err := EncodeOffer(o)
		if err != nil {
			t.Fatalf("decoded offer %+v does not encode: %v", o, err)
		}
		if o2, err := DecodeOffer(enc); err != nil || o2 != o {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", o, enc, o2, err)
		}
	})
}

// FuzzDecodeHello: as FuzzDecodeOffer, for HELLO.
func FuzzDecodeHello(f *testing.F) {
	seedFrames(f, true)
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := DecodeHello(p)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		enc, err := EncodeHello(h)
		if err != nil {
			t.Fatalf("decoded hello %+v does not encode: %v", h, err)
		}
		if h2, err := DecodeHello(enc); err != nil || h2 != h {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", h, enc, h2, err)
		}
	})
}

// FuzzDecodeNack: as FuzzDecodeOffer, for NACK; an encoded NACK always fits
// a control frame.
func FuzzDecodeNack(f *testing.F) {
	seedFrames(f, true)
	f.Fuzz(func(t *testing.T, p []byte) {
		n, err := DecodeNack(p)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		enc, err := EncodeNack(n)
		if err != nil || len(enc) > MaxControlPayload {
			t.Fatalf("decoded nack %+v: encode %d bytes, %v", n, len(enc), err)
		}
		if n2, err := DecodeNack(enc); err != nil || n2 != n {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", n, enc, n2, err)
		}
	})
}

// FuzzRecvRequest: a version 2 receiver fed any byte stream (seeded with
// real frames and with offer+segment and push+segment sequences) never
// panics, accepts at most its window of offers, reads a SEGMENT only for
// an accepted offer or right behind its PUSH and with the announced
// length, takes no PUSH above MaxPushSize, and fails only with the
// documented error classes.
func FuzzRecvRequest(f *testing.F) {
	seedFrames(f, false)
	offer := AppendFrame(nil, TypeOffer, []byte(`{"segment_id":"s1","size":5,"sha256":"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"}`))
	f.Add(append(append([]byte{}, offer...), AppendFrame(nil, TypeSegment, []byte("hello"))...))
	f.Add(append(append(append([]byte{}, offer...), offer...), offer...))
	push := AppendFrame(nil, TypePush, offer[HeaderLen:])
	f.Add(append(append([]byte{}, push...), AppendFrame(nil, TypeSegment, []byte("hello"))...))
	f.Add(append(append(append([]byte{}, offer...), push...), AppendFrame(nil, TypeSegment, []byte("hello"))...))
	f.Fuzz(func(t *testing.T, data []byte) {
		const window = 2
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			a.Write(data)
			a.Close()
		}()
		// Version 3 is version 2 and WANT: one run covers both.
		c := NewConn(b, Options{Version: Version3, Window: window, MaxSegmentSize: 64})
		defer c.Close()
		ctx := context.Background()
		for range 16 {
			req, err := c.RecvRequest(ctx)
			if err != nil {
				if !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrUnknownType) ||
					errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBadMessage) || errors.Is(err, ErrUnexpectedFrame) ||
					errors.Is(err, ErrSizeMismatch) || errors.Is(err, ErrWindow)) {
					t.Fatalf("unexpected error class: %v", err)
				}
				return
			}
			if len(c.open) > window {
				t.Fatalf("%d offers open, window %d", len(c.open), window)
			}
			if req.Query != nil || req.Want != nil {
				if len(req.Query) > MaxQuerySegments || len(req.Want) > MaxQuerySegments {
					t.Fatalf("query of %d, want of %d segments", len(req.Query), len(req.Want))
				}
				continue
			}
			if !req.Segment {
				// Accept every other offer, decline the rest as held.
				if len(c.open)%2 == 1 {
					c.accepted = append(c.accepted, req.Offer)
				} else {
					c.answered(req.Offer.SegmentID)
				}
				continue
			}
			if req.Pushed && req.Offer.Size > MaxPushSize {
				t.Fatalf("PUSH of %d bytes taken", req.Offer.Size)
			}
			var n int64
			err = c.RecvPayload(ctx, req.Offer, func(r io.Reader) error {
				var err error
				n, err = io.Copy(io.Discard, r)
				return err
			})
			if err == nil && n != req.Offer.Size {
				t.Fatalf("read %d payload bytes for an offer of %d", n, req.Offer.Size)
			}
			if err != nil {
				return
			}
			c.answered(req.Offer.SegmentID)
		}
	})
}

// FuzzDecodeSegments: a decoded QUERY/HOLDS list is valid (distinct ids,
// at most MaxQuerySegments) and survives an encode/decode round trip.
func FuzzDecodeSegments(f *testing.F) {
	seedFrames(f, true)
	f.Fuzz(func(t *testing.T, p []byte) {
		list, err := DecodeSegments(p)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		enc, err := EncodeSegments(list)
		if err != nil {
			t.Fatalf("decoded list does not encode: %v", err)
		}
		got, err := DecodeSegments(enc)
		if err != nil || !slices.Equal(got, list) {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", list, enc, got, err)
		}
	})
}
