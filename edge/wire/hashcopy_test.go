package wire

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestCopyHashing: the overlapped copy+hash yields the bytes and the
// digest of a plain copy at every size around the chunk boundaries, and
// reports a source error.
func TestCopyHashing(t *testing.T) {
	for _, n := range []int{0, 1, copyChunk - 1, copyChunk, copyChunk + 1, 3 * copyChunk, 9*copyChunk + 17} {
		src := patterned(n)
		var dst bytes.Buffer
		got, sum, err := CopyHashing(&dst, bytes.NewReader(src))
		want := sha256.Sum256(src)
		if err != nil || got != int64(n) || !bytes.Equal(sum, want[:]) || !bytes.Equal(dst.Bytes(), src) {
			t.Fatalf("size %d: copied %d, err %v, digest ok %v, content ok %v", n, got, err, bytes.Equal(sum, want[:]), bytes.Equal(dst.Bytes(), src))
		}
	}
	boom := errors.New("boom")
	_, _, err := CopyHashing(io.Discard, io.MultiReader(bytes.NewReader(patterned(5*copyChunk)), iotest.ErrReader(boom)))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the source's", err)
	}
	// A truncated SEGMENT (its payload reader's io.ErrUnexpectedEOF) is an
	// error, not a short stream, in the first chunk and after it: the
	// receiver must see that the peer went away.
	for _, n := range []int{1000, 5*copyChunk + 1000} {
		r := PayloadReader(bytes.NewReader(patterned(n)), uint32(n+1))
		if _, _, err := CopyHashing(io.Discard, r); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%d of %d bytes: err = %v, want io.ErrUnexpectedEOF", n, n+1, err)
		}
	}
}

func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131>>3 + n)
	}
	return b
}

// BenchmarkCopyHashing4KiB: a small segment's copy and hash, the
// receiver's per-segment cost (B/op shows the pooled chunk is reused).
func BenchmarkCopyHashing4KiB(b *testing.B) {
	src := patterned(4 << 10)
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if _, _, err := CopyHashing(io.Discard, bytes.NewReader(src)); err != nil {
			b.Fatal(err)
		}
	}
}
