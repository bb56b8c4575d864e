package wire

import (
	"crypto/sha256"
	"io"
	"sync"
)

// copyChunk is the unit handed from the copying goroutine to the hashing
// one; copyBuffers of them circulate, so at most that much is in memory
// (1 MiB per copy in progress).
const (
	copyChunk   = 256 << 10
	copyBuffers = 4
)

// CopyHashing copies src to dst and returns the byte count and the
// SHA-256 of what was copied. The hash runs on its own goroutine, fed the
// chunks the copy has written: on a large segment the receive (TLS
// decryption, the file write) and the hash overlap instead of adding up,
// which on the 64 MiB benchmark was the difference between a copy and a
// copy plus a hash. Small segments (one chunk) are hashed inline: a
// goroutine hand-off would cost more than it saves. Receivers use it
// (segstore's Receive) so a version 2 SEGMENT is hashed once, overlapped.
func CopyHashing(dst io.Writer, src io.Reader) (int64, []byte, error) {
	// The chunks come from a pool: a receiver of small segments would
	// otherwise allocate (and zero) 256 KiB per segment to copy 4 KiB.
	bufs := []*[]byte{chunks.Get().(*[]byte)}
	defer func() {
		for _, b := range bufs {
			chunks.Put(b)
		}
	}()
	first := *bufs[0]
	n, err := fill(src, first)
	if err == io.EOF {
		if _, werr := dst.Write(first[:n]); werr != nil {
			return 0, nil, werr
		}
		sum := sha256.Sum256(first[:n])
		return int64(n), sum[:], nil
	}
	if err != nil {
		return 0, nil, err
	}
	free := make(chan []byte, copyBuffers)
	full := make(chan []byte, copyBuffers)
	for range copyBuffers - 1 {
		b := chunks.Get().(*[]byte)
		bufs = append(bufs, b)
		free <- *b
	}
	sumc := make(chan []byte, 1)
	go func() {
		h := sha256.New()
		for b := range full {
			h.Write(b)
			free <- b[:cap(b)]
		}
		sumc <- h.Sum(nil)
	}()
	total := int64(0)
	buf := first[:n]
	for {
		if _, werr := dst.Write(buf); werr != nil {
			err = werr
			break
		}
		total += int64(len(buf))
		full <- buf
		if err != nil { // the previous read ended the stream
			break
		}
		buf = <-free
		n, err = fill(src, buf)
		buf = buf[:n]
		if err == io.EOF {
			if n == 0 {
				break
			}
		} else if err != nil {
			break
		}
	}
	close(full)
	sum := <-sumc // the hashing goroutine is done with every chunk
	if err == io.EOF {
		err = nil
	}
	return total, sum, err
}

// chunks holds copyChunk buffers for CopyHashing.
var chunks = sync.Pool{New: func() any { b := make([]byte, copyChunk); return &b }}

// fill reads into b until b is full or src returns an error, which it
// returns as it is: io.EOF is the stream's end, and anything else,
// io.ErrUnexpectedEOF from a SEGMENT whose sender went away included, is
// a failure (io.ReadFull would report both as io.ErrUnexpectedEOF).
func fill(src io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := src.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
