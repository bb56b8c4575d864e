package relaycore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Source partition keys (docs/layout.md describes every key and encoding).
// In key order: alarm < lease < os < r/... < rs, so the row pages form one
// contiguous range ["r/", "r0") and a scan from the start of the partition
// meets os before the first page.
const (
	KeyAlarm   = "alarm" // durable alarm record, JSON {"due_ms":N}, written with Write.Due
	KeyLease   = "lease" // optional source lease, JSON
	KeyOS      = "os"    // outbox state, JSON
	KeyRS      = "rs"    // scan cycle state, JSON
	PagePrefix = "r/"    // row pages: "r/" + 16 lowercase hex digits of the page's original first seq
	pageEnd    = "r0"    // first key after every page key ('0' follows '/')
)

// ReservedPrefix starts the engine's own keys in target partitions (the rh
// watermarks). Relay rows may not write keys, and may not name targets,
// starting with it.
const ReservedPrefix = "_relay/"

const rhPrefix = ReservedPrefix + "rh/"

// MaxKeyLen bounds a relay row key (DynamoDB's sort-key limit is 1024 bytes).
const MaxKeyLen = 1024

// pageFormat is the version byte that starts every row page.
const pageFormat = 1

// recentTags is how many of the latest enqueue batch tags os remembers so
// an ambiguous commit can be resolved even after its page was delivered.
const recentTags = 8

// PageKey is the key of the page whose original first row has seq first. A
// partially delivered page is rewritten under the same key, so the key is a
// lower bound of the page's first seq, and key order is seq order.
func PageKey(first uint64) string { return PagePrefix + fmt.Sprintf("%016x", first) }

// RHKey is the target key holding source's watermark: the last seq of
// source applied to that target.
func RHKey(source Partition) string { return rhPrefix + string(source) }

// OutboxState is the os record. Version is bumped by every write so the
// enqueue guard (which compares the whole value) never suffers ABA.
type OutboxState struct {
	// NextSeq is the seq the next committed row gets (seqs start at 1).
	NextSeq uint64 `json:"next"`
	// Version counts os writes.
	Version uint64 `json:"ver"`
	// LastCommitMS is the commit time of the latest enqueue batch. Commit
	// times are made monotonic per source: commit_ms = max(now, last).
	LastCommitMS int64 `json:"last_ms"`
	// LeaseRequired is set by DeclareLeaseRequired (the seed's D34 ref shard).
	LeaseRequired bool `json:"lease_required,omitempty"`
	// Recent holds the tags of the latest enqueue batches, newest last.
	Recent []string `json:"recent,omitempty"`
}

func emptyOS() OutboxState { return OutboxState{NextSeq: 1} }

func decodeOS(raw []byte, found bool) (OutboxState, error) {
	if !found {
		return emptyOS(), nil
	}
	var o OutboxState
	if err := json.Unmarshal(raw, &o); err != nil || o.NextSeq == 0 {
		return OutboxState{}, fmt.Errorf("%w: os %q", ErrCorruptRecord, raw)
	}
	return o, nil
}

func encodeJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings and integers are encoded here.
		panic(fmt.Sprintf("relaycore: encode %T: %v", v, err))
	}
	return b
}

// Claim is a fire's hold on a source: overlapping fires for one source see
// it and step aside instead of spending their budget on the same rows.
type Claim struct {
	Owner   string `json:"owner"`
	UntilMS int64  `json:"until_ms"`
}

// RelayState is the rs record: the source's scan cycle.
type RelayState struct {
	// Version counts rs writes (the checkpoint guard compares whole values).
	Version uint64 `json:"ver"`
	// CycleEnd is the last committed seq when the cycle started
	// (os.next-1); rows after it wait for the next cycle.
	CycleEnd uint64 `json:"cycle_end"`
	// Cursor is the last inspected seq. During an active cycle
	// (Cursor < CycleEnd) every undelivered row with seq <= Cursor has its
	// target in Blocked. Cursor == CycleEnd is the completed marker.
	Cursor uint64 `json:"cursor"`
	// From is the page key where the next scan starts (the page holding
	// seq Cursor+1, when it was written); empty means the head.
	From string `json:"from,omitempty"`
	// Blocked is the sorted set (at most MaxBlockedTargets) of targets whose
	// delivery failed in this cycle.
	Blocked []Partition `json:"blocked,omitempty"`
	// Idle counts consecutive fires that delivered nothing (for back-off).
	Idle int `json:"idle,omitempty"`
	// Claim is the active fire's hold, if any.
	Claim *Claim `json:"claim,omitempty"`
}

// Completed reports whether rs is the completed marker (or no cycle ran yet).
func (rs RelayState) Completed() bool { return rs.Cursor >= rs.CycleEnd }

func decodeRS(raw []byte) (RelayState, error) {
	var rs RelayState
	if err := json.Unmarshal(raw, &rs); err != nil {
		return RelayState{}, fmt.Errorf("%w: rs %q", ErrCorruptRecord, raw)
	}
	return rs, nil
}

// AlarmRecord is the durable alarm: the source's fire is due at DueMS.
type AlarmRecord struct {
	DueMS int64 `json:"due_ms"`
}

func decodeAlarm(raw []byte) (AlarmRecord, error) {
	var a AlarmRecord
	if err := json.Unmarshal(raw, &a); err != nil {
		return AlarmRecord{}, fmt.Errorf("%w: alarm %q", ErrCorruptRecord, raw)
	}
	return a, nil
}

func alarmWrite(dueMS int64) Write {
	if dueMS < 1 {
		dueMS = 1 // Write.Due == 0 means "not indexed"
	}
	return Write{Key: KeyAlarm, Value: encodeJSON(AlarmRecord{DueMS: dueMS}), Due: dueMS}
}

func encodeRH(seq uint64) []byte { return strconv.AppendUint(nil, seq, 10) }

func decodeRH(raw []byte, found bool) (uint64, error) {
	if !found {
		return 0, nil
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: rh %q", ErrCorruptRecord, raw)
	}
	return v, nil
}

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

// Page encoding (format 1), all integers unsigned varints unless noted:
//
//	format byte (1) | first seq | commit ms (signed varint) | len tag | tag |
//	len target | target | row count | rows...
//	row: put count | (len key | key | len value | value)... | delete count | (len key | key)...
//
// The target is stored once per page, not per row, which keeps a 200-byte row
// at about 205 bytes.
func encodePage(p Page) []byte {
	n := pageHeaderMax(p.Tag, p.Target)
	for _, r := range p.Rows {
		n += rowEncodedLen(r)
	}
	b := make([]byte, 0, n)
	b = append(b, pageFormat)
	b = binary.AppendUvarint(b, p.First)
	b = binary.AppendVarint(b, p.CommitMS)
	b = appendBytes(b, []byte(p.Tag))
	b = appendBytes(b, []byte(p.Target))
	b = binary.AppendUvarint(b, uint64(len(p.Rows)))
	for _, r := range p.Rows {
		b = binary.AppendUvarint(b, uint64(len(r.Puts)))
		for _, kv := range r.Puts {
			b = appendBytes(b, []byte(kv.Key))
			b = appendBytes(b, kv.Value)
		}
		b = binary.AppendUvarint(b, uint64(len(r.Deletes)))
		for _, k := range r.Deletes {
			b = appendBytes(b, []byte(k))
		}
	}
	return b
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

// pageHeaderMax bounds the encoded header (varints at their widest).
func pageHeaderMax(tag string, target Partition) int {
	return 1 + binary.MaxVarintLen64*3 + uvarintLen(uint64(len(tag))) + len(tag) +
		uvarintLen(uint64(len(target))) + len(target)
}

// rowEncodedLen is the exact encoded size of r's body in a page.
func rowEncodedLen(r Row) int {
	n := uvarintLen(uint64(len(r.Puts))) + uvarintLen(uint64(len(r.Deletes)))
	for _, kv := range r.Puts {
		n += uvarintLen(uint64(len(kv.Key))) + len(kv.Key) + uvarintLen(uint64(len(kv.Value))) + len(kv.Value)
	}
	for _, k := range r.Deletes {
		n += uvarintLen(uint64(len(k))) + len(k)
	}
	return n
}

type pageReader struct {
	b   []byte
	err bool
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

// DecodePage decodes a row page stored under key. It never panics on
// malformed input; errors wrap ErrCorruptRecord.
func DecodePage(key string, raw []byte) (Page, error) {
	bad := func(why string) (Page, error) {
		return Page{}, fmt.Errorf("%w: page %s: %s", ErrCorruptRecord, key, why)
	}
	if len(raw) == 0 || raw[0] != pageFormat {
		return bad("unknown format")
	}
	r := &pageReader{b: raw[1:]}
	p := Page{Key: key}
	p.First = r.uvarint()
	p.CommitMS = r.varint()
	p.Tag = string(r.bytes())
	p.Target = Partition(r.bytes())
	n := r.count()
	if r.err {
		return bad("truncated header")
	}
	if n == 0 || p.First == 0 || p.First+uint64(n)-1 < p.First {
		return bad("empty page or seq overflow")
	}
	p.Rows = make([]Row, 0, n)
	for i := 0; i < n && !r.err; i++ {
		row := Row{Target: p.Target, Seq: p.First + uint64(i), CommitMS: p.CommitMS}
		np := r.count()
		for j := 0; j < np && !r.err; j++ {
			k := string(r.bytes())
			v := r.bytes()
			row.Puts = append(row.Puts, KV{Key: k, Value: v})
		}
		nd := r.count()
		for j := 0; j < nd && !r.err; j++ {
			row.Deletes = append(row.Deletes, string(r.bytes()))
		}
		p.Rows = append(p.Rows, row)
	}
	if r.err {
		return bad("truncated row")
	}
	if len(r.b) != 0 {
		return bad("trailing bytes")
	}
	return p, nil
}

func isPageKey(k string) bool { return strings.HasPrefix(k, PagePrefix) }
