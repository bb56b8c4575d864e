package wire

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
)

// countingReader fails the test if more than max bytes are read from it.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

func TestReadFrame(t *testing.T) {
	frame := func(typ byte, length uint32, payload string) []byte {
		return append([]byte{typ, byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length)}, payload...)
	}
	for _, tc := range []struct {
		name     string
		in       []byte
		limit    uint32
		want     Frame
		err      error
		readMost int // bytes the reader may consume; 0 means no check
	}{
		{name: "ack", in: frame(0x04, 2, "s1"), limit: 16, want: Frame{TypeAck, []byte("s1")}},
		{name: "empty payload", in: frame(0x04, 0, ""), limit: 16, want: Frame{TypeAck, []byte{}}},
		{name: "at limit", in: frame(0x01, 4, "abcd"), limit: 4, want: Frame{TypeHello, []byte("abcd")}},
		{name: "clean EOF", in: nil, limit: 16, err: io.EOF},
		{name: "truncated header", in: []byte{0x04, 0, 0}, limit: 16, err: io.ErrUnexpectedEOF},
		{name: "truncated payload", in: frame(0x04, 5, "ab"), limit: 16, err: io.ErrUnexpectedEOF},
		{name: "header only", in: frame(0x02, 5, ""), limit: 16, err: io.ErrUnexpectedEOF},
		{name: "unknown type zero", in: frame(0x00, 1, "x"), limit: 16, err: ErrUnknownType, readMost: HeaderLen},
		{name: "unknown type 11", in: frame(0x0b, 1, "x"), limit: 16, err: ErrUnknownType, readMost: HeaderLen},
		{name: "unknown type ff", in: frame(0xff, 1, "x"), limit: 16, err: ErrUnknownType, readMost: HeaderLen},
		// The length is checked before the payload is touched: a 4 GiB
		// claim with no payload behind it must fail without reading.
		{name: "too large", in: frame(0x02, 1<<32-1, ""), limit: MaxControlPayload, err: ErrFrameTooLarge, readMost: HeaderLen},
		{name: "one over limit", in: frame(0x05, 5, "abcde"), limit: 4, err: ErrFrameTooLarge, readMost: HeaderLen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := &countingReader{r: bytes.NewReader(tc.in)}
			got, err := ReadFrame(cr, tc.limit)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ReadFrame error = %v, want %v", err, tc.err)
				}
			} else if err != nil || got.Type != tc.want.Type || !bytes.Equal(got.Payload, tc.want.Payload) {
				t.Fatalf("ReadFrame = %v %q, %v; want %v %q", got.Type, got.Payload, err, tc.want.Type, tc.want.Payload)
			}
			if tc.readMost > 0 && cr.read > tc.readMost {
				t.Fatalf("read %d bytes, want at most %d", cr.read, tc.readMost)
			}
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	for typ := TypeHello; typ <= TypeNack; typ++ {
		if err := WriteFrame(&b, typ, []byte(typ.String())); err != nil {
			t.Fatal(err)
		}
	}
	for typ := TypeHello; typ <= TypeNack; typ++ {
		f, err := ReadFrame(&b, MaxControlPayload)
		if err != nil || f.Type != typ || string(f.Payload) != typ.String() {
			t.Fatalf("frame %v: got %v %q %v", typ, f.Type, f.Payload, err)
		}
	}
	if _, err := ReadFrame(&b, MaxControlPayload); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestWriteSegment(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int64
		src  string
		err  error
	}{
		{"exact", 5, "hello", nil},
		{"empty", 0, "", nil},
		{"source longer than size", 3, "hello", nil},
		{"larger than one chunk", segmentChunk*2 + 7, strings.Repeat("x", segmentChunk*2+7), nil},
		{"short source", 6, "hello", io.ErrUnexpectedEOF},
		{"short source after a chunk", segmentChunk + 10, strings.Repeat("x", segmentChunk+3), io.ErrUnexpectedEOF},
		{"negative size", -1, "", ErrFrameTooLarge},
		{"size over length field", MaxSegmentSize + 1, "", ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			src := strings.NewReader(tc.src)
			err := WriteSegment(&b, tc.size, src)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("WriteSegment error = %v, want %v", err, tc.err)
				}
				if errors.Is(tc.err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrSource) {
					t.Fatalf("short source error %v does not match ErrSource", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if src.Len() != len(tc.src)-int(tc.size) {
				t.Fatalf("read %d source bytes, want exactly %d", len(tc.src)-src.Len(), tc.size)
			}
			h, err := ReadHeader(&b)
			if err != nil || h.Type != TypeSegment || int64(h.Length) != tc.size {
				t.Fatalf("header %+v, %v", h, err)
			}
			if b.String() != tc.src[:tc.size] {
				t.Fatalf("payload mismatch: %d bytes", b.Len())
			}
		})
	}
}

type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

func TestWriteSegmentSourceError(t *testing.T) {
	boom := errors.New("disk gone")
	err := WriteSegment(io.Discard, 10, failingReader{boom})
	if !errors.Is(err, boom) || !errors.Is(err, ErrSource) {
		t.Fatalf("err = %v, want ErrSource wrapping the source error", err)
	}
}

func TestPayloadReader(t *testing.T) {
	r := PayloadReader(strings.NewReader("abcdefNEXT"), 6)
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "abcdef" {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	_, err = io.ReadAll(PayloadReader(strings.NewReader("abc"), 6))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short payload: %v, want io.ErrUnexpectedEOF", err)
	}
}

// patternReader yields n deterministic bytes without holding them.
type patternReader struct{ left, off int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	for i := range b {
		b[i] = byte((p.off + int64(i)) * 131 >> 3)
	}
	p.left -= int64(len(b))
	p.off += int64(len(b))
	return len(b), nil
}

// TestSegmentStreamsWithoutBuffering pushes a 64 MiB segment through
// WriteSegment and PayloadReader over a pipe and checks that the process
// allocated far less than the segment: the payload is streamed, never held.
func TestSegmentStreamsWithoutBuffering(t *testing.T) {
	const size = 64 << 20
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	go func() { done <- pw.CloseWithError(WriteSegment(pw, size, &patternReader{left: size})) }()
	h, err := ReadHeader(pr)
	if err != nil || h.Length != size {
		t.Fatalf("header %+v, %v", h, err)
	}
	sum := sha256.New()
	n, err := io.CopyBuffer(sum, PayloadReader(pr, h.Length), make([]byte, segmentChunk))
	if err != nil || n != size {
		t.Fatalf("copied %d, %v", n, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Fatalf("streaming a %d-byte segment allocated %d bytes; it is being buffered", size, alloc)
	}
	want := sha256.New()
	io.Copy(want, &patternReader{left: size})
	if !bytes.Equal(sum.Sum(nil), want.Sum(nil)) {
		t.Fatal("payload differs from source")
	}
}
