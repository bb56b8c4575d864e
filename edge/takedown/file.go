package takedown

import (
	"bufio"
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"
)

// Result is one line's outcome in VerifyAll: the receipt as the line
// states it (zero if the line did not parse) and why it was refused, or
// nil if it verified.
type Result struct {
	Line    int // 1-based
	Receipt Receipt
	Err     error
}

// WriteLines writes receipts as a receipt file: one MarshalLine per line,
// each ending in "\n".
func WriteLines(w io.Writer, receipts []Signed) error {
	bw := bufio.NewWriter(w)
	for _, s := range receipts {
		bw.Write(s.MarshalLine())
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// VerifyAll reads a receipt file and verifies every line (Verify with
// roots and now). Every line must be a receipt: an empty line, or a last
// line without its line break, is a refused line, not skipped, so a
// truncated file does not read as a shorter valid one. The error is for
// the file itself: unreadable, or a line longer than MaxLineBytes (no
// line after it is read).
func VerifyAll(r io.Reader, roots *x509.CertPool, now time.Time) ([]Result, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Result
	for n := 1; ; n++ {
		l, err := readLine(br)
		if errors.Is(err, io.EOF) && l == nil {
			return out, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return out, fmt.Errorf("line %d: %w", n, err)
		}
		res := Result{Line: n}
		switch {
		case errors.Is(err, io.EOF):
			res.Err = fmt.Errorf("%w: last line has no line break (file cut short?)", ErrMalformed)
		default:
			var s Signed
			if s, res.Err = ParseLine(l); res.Err == nil {
				res.Receipt = s.Receipt
				_, res.Err = Verify(s, roots, now)
			}
		}
		out = append(out, res)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
	}
}

// readLine returns the next line without its "\n"; io.EOF with the bytes
// of a last line that has no line break, or with nil at the end.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf bytes.Buffer
	for {
		chunk, err := br.ReadSlice('\n')
		if buf.Len()+len(chunk) > MaxLineBytes+1 {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrMalformed, MaxLineBytes)
		}
		buf.Write(chunk)
		switch {
		case err == nil:
			return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if buf.Len() == 0 {
				return nil, io.EOF
			}
			return buf.Bytes(), io.EOF
		default:
			return nil, err
		}
	}
}
