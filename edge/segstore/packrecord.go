package segstore

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// A pack record is one small segment inside a pack file (packs.go). It
// describes itself, so that the index can be rebuilt from the packs as
// it is from the segment files' digest tags:
//
//	offset  size  field
//	0       4     magic "ESR1"
//	4       1     id length (1..128)
//	5       1     source length (0..64)
//	6       2     zero
//	8       8     content size (big-endian)
//	16      8     received time, Unix nanoseconds (big-endian)
//	24      32    SHA-256 of the content, as the offer named it
//	56      n     id, then source (the peer it came from; "" for ingest)
//	56+n    4     CRC-32C of bytes 0..56+n (big-endian)
//	60+n    size  content
//	...     0-7   zero padding to a multiple of 8 bytes
//
// The header is written with the content, after the content was verified
// against the digest, and the record becomes durable before its index
// entry commits; so a record whose content hashes to its header's digest
// is what was verified (the header plays the digest tag's part). Records
// start at multiples of 8, and an evicted record is zeroed (its blocks
// punched out of the file): a rebuild steps over zeros 8 bytes at a time
// and never reads a record's content as a header, because a header
// always starts with the non-zero magic and nothing else is skipped.
const (
	recordMagic     = "ESR1"
	recordFixed     = 56
	recordCRCLen    = 4
	recordAlign     = 8
	maxRecordHeader = recordFixed + MaxIDLen + wire.MaxNodeIDLen + recordCRCLen
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordHeader is a decoded pack record header.
type recordHeader struct {
	id, source string
	size       int64
	received   time.Time
	sha256     string // lower-case hex
	headerLen  int64  // offset of the content within the record
}

// recordLen is the length of the record, padding included.
func (h recordHeader) recordLen() int64 { return alignRecord(h.headerLen + h.size) }

func alignRecord(n int64) int64 { return (n + recordAlign - 1) / recordAlign * recordAlign }

// recordHeaderLen is the header length of a record for id and source.
func recordHeaderLen(id, source string) int64 {
	return int64(recordFixed + len(id) + len(source) + recordCRCLen)
}

// encodeRecord returns e's record with content, padding included. The
// entry's id, source and digest were checked on their way in.
func encodeRecord(e Entry, content []byte) []byte {
	hl := recordHeaderLen(e.ID, e.Source)
	b := make([]byte, alignRecord(hl+int64(len(content))))
	putRecordHeader(b, e, int64(len(content)))
	copy(b[hl:], content)
	return b
}

// putRecordHeader writes the header of e's record, for size bytes of
// content, at the start of b.
func putRecordHeader(b []byte, e Entry, size int64) {
	copy(b, recordMagic)
	b[4], b[5] = byte(len(e.ID)), byte(len(e.Source))
	binary.BigEndian.PutUint64(b[8:], uint64(size))
	binary.BigEndian.PutUint64(b[16:], uint64(e.Received.UnixNano()))
	hex.Decode(b[24:56], []byte(e.SHA256))
	n := copy(b[recordFixed:], e.ID)
	n += copy(b[recordFixed+n:], e.Source)
	binary.BigEndian.PutUint32(b[recordFixed+n:], crc32.Checksum(b[:recordFixed+n], castagnoli))
}

// errNotRecord means the bytes at an offset are not a record header:
// neither all zero (a punched record, or padding) nor a valid header.
var errNotRecord = errors.New("not a pack record header")

// readRecordHeader decodes the header of the record at off in r. It
// returns io.EOF at the end of r, and errNotRecord (wrapped, saying why)
// for bytes that are not a valid header.
func readRecordHeader(r io.ReaderAt, off int64) (recordHeader, error) {
	buf := make([]byte, maxRecordHeader)
	n, err := r.ReadAt(buf, off)
	if n == 0 && err != nil {
		return recordHeader{}, err
	}
	return parseRecordHeader(buf[:n])
}

// parseRecordHeader decodes a header from the start of b (b may hold
// more than the header, or be cut short by the end of the file).
func parseRecordHeader(b []byte) (recordHeader, error) {
	if len(b) < recordFixed || !bytes.Equal(b[:4], []byte(recordMagic)) {
		return recordHeader{}, fmt.Errorf("%w: no magic", errNotRecord)
	}
	idLen, srcLen := int(b[4]), int(b[5])
	end := recordFixed + idLen + srcLen
	if b[6] != 0 || b[7] != 0 || len(b) < end+recordCRCLen {
		return recordHeader{}, fmt.Errorf("%w: bad lengths", errNotRecord)
	}
	if got, want := crc32.Checksum(b[:end], castagnoli), binary.BigEndian.Uint32(b[end:]); got != want {
		return recordHeader{}, fmt.Errorf("%w: header crc %08x, computed %08x", errNotRecord, want, got)
	}
	h := recordHeader{
		id:        string(b[recordFixed : recordFixed+idLen]),
		source:    string(b[recordFixed+idLen : end]),
		size:      int64(binary.BigEndian.Uint64(b[8:])),
		received:  time.Unix(0, int64(binary.BigEndian.Uint64(b[16:]))).UTC(),
		sha256:    hex.EncodeToString(b[24:56]),
		headerLen: int64(end + recordCRCLen),
	}
	if err := ValidID(h.id); err != nil {
		return recordHeader{}, fmt.Errorf("%w: %w", errNotRecord, err)
	}
	if h.source != "" && wire.CheckNodeID(h.source) != nil {
		return recordHeader{}, fmt.Errorf("%w: source %q is not a node id", errNotRecord, h.source)
	}
	if h.size < 0 || h.size > 1<<40 {
		return recordHeader{}, fmt.Errorf("%w: size %d", errNotRecord, h.size)
	}
	return h, nil
}

// allZero reports whether b is all zero bytes.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
