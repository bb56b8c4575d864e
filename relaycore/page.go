package relaycore

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Row pages are the stored unit of the outbox: rows of ONE target with
// contiguous seqs from one enqueue batch (docs/layout.md, "Row pages").
// Encoders write format 2; decoders also read format 1, which engines
// before it wrote and which may still sit in outboxes.
//
// Format 2, integers unsigned LEB128 varints unless noted:
//
//	format byte (2) | flags byte | first seq | commit ms (zig-zag varint) |
//	len tag | tag | len target | target | body
//	body, flags&pageDeflate == 0: the row section
//	body, flags&pageDeflate != 0: len row section | row section as raw DEFLATE (RFC 1951)
//	row section: row count | rows...
//	row: put count | (key | len value | value)... | delete count | key...
//	key: bytes shared with the previous key of the page | len suffix | suffix
//
// Format 1: format byte (1) | first seq | commit ms | len tag | tag |
// len target | target | row count | rows, with keys as len key | key.
//
// Why: DynamoDB bills a page once when it is enqueued and once when it is
// deleted, twice per started KB each time (transactions), so page bytes are
// most of the relay's cost beyond the target write. The target is stored
// once per page, consecutive keys share their prefix, and the row section is
// compressed when that makes it shorter, which for JSON records cuts a page
// to about a quarter. The header stays uncompressed so the tag and seqs
// cost nothing to read.
const (
	pageFormat1 = 1
	pageFormat2 = 2

	// pageDeflate flags a body holding the row section DEFLATE-compressed.
	pageDeflate byte = 1
	pageFlags        = pageDeflate // every flag a decoder understands
)

// maxPageRawBytes bounds the inflated row section of a compressed page, so a
// hostile or corrupt page cannot make a decoder allocate without limit.
// Encoders never compress a longer section (it is stored as is).
const maxPageRawBytes = 1 << 20

// maxPageKeyBytes bounds the summed length of a page's decoded keys. Format 2
// stores a key as the length it shares with the previous key plus the rest,
// so a few bytes of page can stand for a key of maxKeyLen bytes: without a
// bound, a hostile page of a few hundred bytes decodes into gigabytes of
// keys. Encoders never write a page of several rows beyond it (packPage) and
// validation refuses a row beyond it; with the stores' 400 KB item limit no
// page comes near it.
const maxPageKeyBytes = 4 << 20

// maxDeflateRatio is DEFLATE's best possible ratio (a 258-byte match in
// about two bits): a declared length beyond it is corrupt without inflating.
const maxDeflateRatio = 1032

// minCompressBytes: a shorter row section is stored as is. Such a page,
// with its key, a partition name of up to 255 bytes and the attribute names,
// stays within one 1 KB write unit whatever its size, so compressing it
// would spend CPU (and a compressor of about 800 KB) for nothing.
const minCompressBytes = 640

// Page is a decoded row page: rows of one target with contiguous seqs
// First, First+1, ..., all committed in one enqueue batch.
type Page struct {
	Key      string
	First    uint64
	CommitMS int64
	// Tag identifies the enqueue batch that wrote the page; it resolves
	// ambiguous commits and survives partial rewrites.
	Tag    string
	Target Partition
	Rows   []Row // Seq, CommitMS and Target filled in
}

// Last is the seq of the page's last row.
func (p Page) Last() uint64 { return p.First + uint64(len(p.Rows)) - 1 }

// pageCodec encodes pages, reusing one DEFLATE compressor across pages
// because its state (about 800 KB) is too large to allocate per page. The
// zero value is ready and compresses; it is not safe for concurrent use.
type pageCodec struct {
	// plain: never compress (Capabilities.UncompressedPages).
	plain bool
	zw    *flate.Writer
	zbuf  bytes.Buffer
}

// codecFor is a page codec for a store with caps.
func codecFor(caps Capabilities) pageCodec { return pageCodec{plain: caps.UncompressedPages} }

// encodePage encodes p in the current format (a one-off codec).
func encodePage(p Page) []byte {
	var c pageCodec
	return c.encode(p)
}

func (c *pageCodec) encode(p Page) []byte {
	flags, body := c.body(p.Rows)
	return assemblePage(p.First, p.CommitMS, p.Tag, p.Target, flags, body)
}

// body returns the page body for rows and its flags: the row section,
// DEFLATE-compressed when the codec compresses, the section is at least
// minCompressBytes (and at most maxPageRawBytes) long and compression
// shortens it. The result never aliases the codec's buffers.
func (c *pageCodec) body(rows []Row) (byte, []byte) {
	raw := appendRowSection(nil, rows)
	if c.plain || len(raw) < minCompressBytes || len(raw) > maxPageRawBytes {
		return 0, raw
	}
	c.zbuf.Reset()
	if c.zw == nil {
		// DefaultCompression: BestCompression gains about 1% on record
		// payloads; BestSpeed loses about 12% and allocates more.
		zw, err := flate.NewWriter(&c.zbuf, flate.DefaultCompression)
		if err != nil {
			panic(fmt.Sprintf("relaycore: flate writer: %v", err)) // only for an invalid level
		}
		c.zw = zw
	} else {
		c.zw.Reset(&c.zbuf)
	}
	// Writes to a bytes.Buffer cannot fail.
	_, _ = c.zw.Write(raw)
	_ = c.zw.Close()
	if uvarintLen(uint64(len(raw)))+c.zbuf.Len() >= len(raw) {
		return 0, raw
	}
	body := make([]byte, 0, uvarintLen(uint64(len(raw)))+c.zbuf.Len())
	body = binary.AppendUvarint(body, uint64(len(raw)))
	return pageDeflate, append(body, c.zbuf.Bytes()...)
}

// assemblePage prefixes a body with the format-2 header.
func assemblePage(first uint64, commitMS int64, tag string, target Partition, flags byte, body []byte) []byte {
	b := make([]byte, 0, pageHeaderMax(tag, target)+len(body))
	b = append(b, pageFormat2, flags)
	b = binary.AppendUvarint(b, first)
	b = binary.AppendVarint(b, commitMS)
	b = appendBytes(b, []byte(tag))
	b = appendBytes(b, []byte(target))
	return append(b, body...)
}

// appendRowSection appends the row count and the rows, each key stored as
// the length it shares with the previous key of the page plus the rest.
func appendRowSection(b []byte, rows []Row) []byte {
	b = binary.AppendUvarint(b, uint64(len(rows)))
	prev := ""
	for _, r := range rows {
		b = binary.AppendUvarint(b, uint64(len(r.Puts)))
		for _, kv := range r.Puts {
			b = appendKey(b, prev, kv.Key)
			b = appendBytes(b, kv.Value)
			prev = kv.Key
		}
		b = binary.AppendUvarint(b, uint64(len(r.Deletes)))
		for _, k := range r.Deletes {
			b = appendKey(b, prev, k)
			prev = k
		}
	}
	return b
}

func sharedPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func appendKey(b []byte, prev, k string) []byte {
	n := sharedPrefix(prev, k)
	b = binary.AppendUvarint(b, uint64(n))
	return appendBytes(b, []byte(k[n:]))
}

// rowSectionLen is the exact size r adds to a row section after the key
// prev, and the last key it writes (prev when it writes none).
func rowSectionLen(r Row, prev string) (int, string) {
	n := uvarintLen(uint64(len(r.Puts))) + uvarintLen(uint64(len(r.Deletes)))
	key := func(k string) {
		s := sharedPrefix(prev, k)
		n += uvarintLen(uint64(s)) + uvarintLen(uint64(len(k)-s)) + len(k) - s
		prev = k
	}
	for _, kv := range r.Puts {
		key(kv.Key)
		n += uvarintLen(uint64(len(kv.Value))) + len(kv.Value)
	}
	for _, k := range r.Deletes {
		key(k)
	}
	return n, prev
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// pageHeaderMax bounds the encoded header of either format, row count
// included (varints at their widest).
func pageHeaderMax(tag string, target Partition) int {
	return 2 + binary.MaxVarintLen64*3 + uvarintLen(uint64(len(tag))) + len(tag) +
		uvarintLen(uint64(len(target))) + len(target)
}

// rowEncodedLen bounds r's encoded size in either page format: the row
// with full keys and no compression. Format 2 stores each key as the length
// it shares with the previous key, the length of the rest, and the rest; with
// nothing shared that is one varint more than format 1, so each key is
// counted with two length varints. Planners bound pages with it so that any
// rewrite of a page's remaining rows fits where the page did.
func rowEncodedLen(r Row) int {
	n := uvarintLen(uint64(len(r.Puts))) + uvarintLen(uint64(len(r.Deletes)))
	for _, kv := range r.Puts {
		n += 2*uvarintLen(uint64(len(kv.Key))) + len(kv.Key) + uvarintLen(uint64(len(kv.Value))) + len(kv.Value)
	}
	for _, k := range r.Deletes {
		n += 2*uvarintLen(uint64(len(k))) + len(k)
	}
	return n
}

// rowKeyBytes is the summed length of r's keys, as a decoder builds them.
func rowKeyBytes(r Row) int {
	n := 0
	for _, kv := range r.Puts {
		n += len(kv.Key)
	}
	for _, k := range r.Deletes {
		n += len(k)
	}
	return n
}

// pageRewriteBound bounds the encoding of any suffix of p's rows under p's
// header: a codec never writes more than the rows with full keys
// uncompressed.
func pageRewriteBound(p Page) int {
	n := pageHeaderMax(p.Tag, p.Target)
	for _, r := range p.Rows {
		n += rowEncodedLen(r)
	}
	return n
}

type pageReader struct {
	b   []byte
	err bool
	// keyBudget is what decoded keys may still add up to
	// (maxPageKeyBytes at the start); overKeys records that a key would
	// have overrun it.
	keyBudget int
	overKeys  bool
}

// chargeKey takes n bytes of key from the budget, failing the read when
// the budget cannot pay for them.
func (r *pageReader) chargeKey(n int) bool {
	if n > r.keyBudget {
		r.err, r.overKeys = true, true
		return false
	}
	r.keyBudget -= n
	return true
}

func (r *pageReader) byte() byte {
	if len(r.b) == 0 {
		r.err = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *pageReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *pageReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *pageReader) bytes() []byte {
	n := r.uvarint()
	if r.err || n > uint64(len(r.b)) {
		r.err = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// count reads a length that must be satisfiable by the remaining bytes
// (each element takes at least one byte), so a hostile count cannot make
// the decoder allocate more than the page's size.
func (r *pageReader) count() int {
	n := r.uvarint()
	if r.err || n > uint64(len(r.b)) {
		r.err = true
		return 0
	}
	return int(n)
}

// key reads a format-2 key: shared prefix length with prev, then the rest.
// It charges the key's length to the key budget before building it.
func (r *pageReader) key(prev string) string {
	shared := r.uvarint()
	if r.err || shared > uint64(len(prev)) {
		r.err = true
		return ""
	}
	rest := r.bytes()
	if r.err || !r.chargeKey(int(shared)+len(rest)) {
		return ""
	}
	return prev[:shared] + string(rest)
}

// pageHeader reads only a page's first seq and commit time, which precede
// its (possibly compressed) rows in every format.
func pageHeader(key string, raw []byte) (first uint64, commitMS int64, err error) {
	if len(raw) == 0 || (raw[0] != pageFormat1 && raw[0] != pageFormat2) {
		return 0, 0, fmt.Errorf("%w: page %s: unknown format", ErrCorruptRecord, key)
	}
	r := &pageReader{b: raw[1:]}
	if raw[0] == pageFormat2 {
		if flags := r.byte(); flags&^pageFlags != 0 {
			return 0, 0, fmt.Errorf("%w: page %s: unknown flags %#x", ErrCorruptRecord, key, flags)
		}
	}
	first, commitMS = r.uvarint(), r.varint()
	if r.err {
		return 0, 0, fmt.Errorf("%w: page %s: truncated header", ErrCorruptRecord, key)
	}
	return first, commitMS, nil
}

// decodePage decodes a row page (format 1 or 2) stored under key. It never
// panics on malformed input and bounds what it allocates by the page's
// size (a compressed section by maxPageRawBytes, decoded keys by
// maxPageKeyBytes); errors wrap ErrCorruptRecord.
func decodePage(key string, raw []byte) (Page, error) {
	bad := func(why string) (Page, error) {
		return Page{}, fmt.Errorf("%w: page %s: %s", ErrCorruptRecord, key, why)
	}
	if len(raw) == 0 || (raw[0] != pageFormat1 && raw[0] != pageFormat2) {
		return bad("unknown format")
	}
	format := raw[0]
	r := &pageReader{b: raw[1:]}
	var flags byte
	if format == pageFormat2 {
		if flags = r.byte(); flags&^pageFlags != 0 {
			return bad(fmt.Sprintf("unknown flags %#x", flags))
		}
	}
	p := Page{Key: key}
	p.First = r.uvarint()
	p.CommitMS = r.varint()
	p.Tag = string(r.bytes())
	p.Target = Partition(r.bytes())
	if r.err {
		return bad("truncated header")
	}
	if flags&pageDeflate != 0 {
		n := r.uvarint()
		if r.err || n > maxPageRawBytes || n > uint64(len(r.b))*maxDeflateRatio {
			return bad("bad row section length")
		}
		section, err := inflate(r.b, int(n))
		if err != nil {
			return bad("row section: " + err.Error())
		}
		r.b = section
	}
	n := r.count()
	if r.err {
		return bad("truncated header")
	}
	if n == 0 || p.First == 0 || p.First+uint64(n)-1 < p.First {
		return bad("empty page or seq overflow")
	}
	p.Rows = make([]Row, 0, n)
	prev := ""
	r.keyBudget = maxPageKeyBytes
	readKey := func() string {
		if format == pageFormat1 {
			k := r.bytes()
			if r.err || !r.chargeKey(len(k)) {
				return ""
			}
			return string(k)
		}
		prev = r.key(prev)
		return prev
	}
	for i := 0; i < n && !r.err; i++ {
		row := Row{Target: p.Target, Seq: p.First + uint64(i), CommitMS: p.CommitMS}
		np := r.count()
		for j := 0; j < np && !r.err; j++ {
			k := readKey()
			v := r.bytes()
			row.Puts = append(row.Puts, KV{Key: k, Value: v})
		}
		nd := r.count()
		for j := 0; j < nd && !r.err; j++ {
			row.Deletes = append(row.Deletes, readKey())
		}
		p.Rows = append(p.Rows, row)
	}
	if r.overKeys {
		return bad(fmt.Sprintf("keys sum to more than %d bytes", maxPageKeyBytes))
	}
	if r.err {
		return bad("truncated row")
	}
	if len(r.b) != 0 {
		return bad("trailing bytes")
	}
	return p, nil
}

var errDeflateLength = errors.New("inflated length differs from the declared length")

// inflate decompresses a complete raw DEFLATE stream of exactly n bytes
// that uses all of z.
func inflate(z []byte, n int) ([]byte, error) {
	src := bytes.NewReader(z)
	fr := flate.NewReader(src) // src is an io.ByteReader: flate reads no byte past the stream
	out := make([]byte, n)
	if _, err := io.ReadFull(fr, out); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errDeflateLength
		}
		return nil, err
	}
	var more [1]byte
	if m, err := fr.Read(more[:]); m != 0 || err != io.EOF {
		if err != nil && err != io.EOF {
			return nil, err
		}
		return nil, errDeflateLength
	}
	if src.Len() != 0 {
		return nil, errors.New("bytes after the compressed stream")
	}
	return out, nil
}
