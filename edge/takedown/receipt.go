package takedown

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// Version1 is the first line of a version-1 receipt's canonical bytes.
const Version1 = "relay-takedown-receipt/1"

// MaxRequestIDLen bounds a request id: relaycore's takedown key suffix
// (content id, holder, 19 digits, two '/') is at most 213 bytes.
const MaxRequestIDLen = 256

// timeLayout is evicted_at's only encoding: UTC, nanoseconds, fixed width,
// so the bytes sort and compare as the times do.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

var requestPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._:/-]*$`)

// Receipt says that Node evicted the segment ContentID, whose content had
// digest SHA256, at EvictedAt, for the takedown request Request.
type Receipt struct {
	Request   string
	ContentID string
	SHA256    string
	Node      string
	EvictedAt time.Time
}

// CheckRequestID reports why id is not a valid request id, or nil: 1 to
// MaxRequestIDLen bytes of [A-Za-z0-9._:/-], the first a letter, digit or
// '_'.
func CheckRequestID(id string) error {
	if len(id) == 0 || len(id) > MaxRequestIDLen {
		return fmt.Errorf("%w: request id must be 1..%d bytes, got %d", ErrMalformed, MaxRequestIDLen, len(id))
	}
	if !requestPattern.MatchString(id) {
		return fmt.Errorf("%w: request id %q: only [A-Za-z0-9._:/-], starting with a letter, digit or '_'", ErrMalformed, id)
	}
	return nil
}

// Validate reports why r cannot be a receipt, or nil.
func (r Receipt) Validate() error {
	if err := CheckRequestID(r.Request); err != nil {
		return err
	}
	if err := wire.CheckSegmentID(r.ContentID); err != nil {
		return fmt.Errorf("%w: content_id: %v", ErrMalformed, err)
	}
	if !validDigest(r.SHA256) {
		return fmt.Errorf("%w: sha256 %q: want 64 lowercase hex digits", ErrMalformed, trunc(r.SHA256))
	}
	if err := wire.CheckNodeID(r.Node); err != nil {
		return fmt.Errorf("%w: node: %v", ErrMalformed, err)
	}
	if y := r.EvictedAt.UTC().Year(); y < 1970 || y > 9999 {
		return fmt.Errorf("%w: evicted_at %v outside years 1970..9999", ErrMalformed, r.EvictedAt)
	}
	return nil
}

// Canonical returns the bytes a node signs (see the package doc), or why r
// is not valid.
func (r Receipt) Canonical() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(len(Version1) + len(r.Request) + len(r.ContentID) + len(r.SHA256) + len(r.Node) + 96)
	for _, l := range [][2]string{
		{"", Version1},
		{"request=", r.Request},
		{"content_id=", r.ContentID},
		{"sha256=", r.SHA256},
		{"node=", r.Node},
		{"evicted_at=", r.EvictedAt.UTC().Format(timeLayout)},
	} {
		b.WriteString(l[0])
		b.WriteString(l[1])
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// Parse reads canonical bytes back into a Receipt. Anything that is not
// exactly Canonical's output for some valid receipt is ErrMalformed.
func Parse(b []byte) (Receipt, error) {
	s := string(b)
	if !strings.HasSuffix(s, "\n") {
		return Receipt{}, fmt.Errorf("%w: receipt does not end with a line break", ErrMalformed)
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	keys := []string{"", "request=", "content_id=", "sha256=", "node=", "evicted_at="}
	if len(lines) != len(keys) {
		return Receipt{}, fmt.Errorf("%w: receipt has %d lines, want %d", ErrMalformed, len(lines), len(keys))
	}
	if lines[0] != Version1 {
		return Receipt{}, fmt.Errorf("%w: first line %q, want %q", ErrMalformed, trunc(lines[0]), Version1)
	}
	vals := make([]string, len(keys))
	for i := 1; i < len(keys); i++ {
		v, ok := strings.CutPrefix(lines[i], keys[i])
		if !ok {
			return Receipt{}, fmt.Errorf("%w: line %d %q, want %s…", ErrMalformed, i+1, trunc(lines[i]), keys[i])
		}
		vals[i] = v
	}
	at, err := time.Parse(timeLayout, vals[5])
	if err != nil {
		return Receipt{}, fmt.Errorf("%w: evicted_at: %v", ErrMalformed, err)
	}
	r := Receipt{Request: vals[1], ContentID: vals[2], SHA256: vals[3], Node: vals[4], EvictedAt: at}
	again, err := r.Canonical()
	if err != nil {
		return Receipt{}, err
	}
	if !bytes.Equal(again, b) {
		return Receipt{}, fmt.Errorf("%w: receipt is not in canonical form", ErrMalformed)
	}
	return r, nil
}

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// trunc keeps error messages about hostile input short.
func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
