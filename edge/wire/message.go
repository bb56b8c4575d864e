package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Identifier rules. Segment ids become file names on the receiver and node
// ids appear in certificate URIs and log lines, so both use one small
// alphabet: letters, digits, '.', '_', '-'. The first character must be a
// letter, digit or '_': no leading '.' (no "." / ".." / hidden files) and no
// leading '-' (not mistaken for a command-line flag).
const (
	MaxSegmentIDLen = 128
	MaxNodeIDLen    = 64
	// MaxNackMessage bounds a NACK's human-readable message, in bytes.
	MaxNackMessage = 1024
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// CheckSegmentID reports why id is not a valid segment id (ErrInvalidID),
// or nil. Stores and CLIs use it too, so every component agrees.
func CheckSegmentID(id string) error { return checkID("segment id", id, MaxSegmentIDLen) }

// CheckNodeID reports why id is not a valid node id (ErrInvalidID), or nil.
func CheckNodeID(id string) error { return checkID("node id", id, MaxNodeIDLen) }

func checkID(what, id string, max int) error {
	if len(id) == 0 || len(id) > max {
		return fmt.Errorf("%w: %s must be 1..%d bytes, got %d", ErrInvalidID, what, max, len(id))
	}
	if !idPattern.MatchString(id) {
		return fmt.Errorf("%w: %s %q: only [A-Za-z0-9._-], not starting with '.' or '-'", ErrInvalidID, what, id)
	}
	return nil
}

// badMessage marks an invalid identifier inside a message as ErrBadMessage.
func badMessage(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadMessage, err)
}

// MaxWindow bounds the window a HELLO may announce: offers in flight on
// one connection. Each costs the receiver a reservation and, while its
// commit runs, a file descriptor.
const MaxWindow = 4096

// Hello is the HELLO payload.
type Hello struct {
	Version int    `json:"version"`
	NodeID  string `json:"node_id"`
	// Window (version 2 and later; absent in version 1) is how many
	// offers the sender of this HELLO accepts unanswered on the
	// connection, 1..MaxWindow.
	Window int `json:"window,omitempty"`
}

// Validate checks the fields' syntax. Any positive version is well formed;
// whether it is spoken is Conn.RecvHello's decision. Version 1 has no
// window (its decoders refuse the key); later versions require one.
func (h Hello) Validate() error {
	if h.Version < 1 {
		return fmt.Errorf("%w: version %d must be positive", ErrBadMessage, h.Version)
	}
	switch {
	case h.Version == Version1 && h.Window != 0:
		return fmt.Errorf("%w: version 1 has no window, got %d", ErrBadMessage, h.Window)
	case h.Version > Version1 && (h.Window < 1 || h.Window > MaxWindow):
		return fmt.Errorf("%w: window %d outside 1..%d", ErrBadMessage, h.Window, MaxWindow)
	}
	return badMessage(CheckNodeID(h.NodeID))
}

// Offer is the OFFER payload.
type Offer struct {
	SegmentID string `json:"segment_id"`
	Size      int64  `json:"size"`
	// SHA256 is the segment's digest as 64 lowercase hex characters.
	SHA256 string `json:"sha256"`
}

// Validate checks the fields' syntax.
func (o Offer) Validate() error {
	if err := CheckSegmentID(o.SegmentID); err != nil {
		return badMessage(err)
	}
	if o.Size < 0 || o.Size > MaxSegmentSize {
		return fmt.Errorf("%w: size %d outside 0..%d", ErrBadMessage, o.Size, int64(MaxSegmentSize))
	}
	return checkSHA256(o.SHA256)
}

func checkSHA256(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("%w: sha256 must be 64 lowercase hex characters, got %d", ErrBadMessage, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%w: sha256 must be lowercase hex, byte %d is %q", ErrBadMessage, i, c)
		}
	}
	return nil
}

// NackCode says why a receiver refused a segment.
type NackCode string

// NACK codes (docs/wire.md).
const (
	// NackQuota: storing the segment would exceed the receiver's quota
	// (total bytes or segment count). Retrying later may succeed.
	NackQuota NackCode = "quota"
	// NackChecksum: the received bytes do not match the offer's sha256.
	NackChecksum NackCode = "checksum"
	// NackTooLarge: the segment exceeds the receiver's maximum segment size.
	// Retrying will not help.
	NackTooLarge NackCode = "too_large"
	// NackBadRequest: the offer or the frame sequence was malformed.
	NackBadRequest NackCode = "bad_request"
	// NackInternal: the receiver failed (e.g. disk error); retry later.
	NackInternal NackCode = "internal"
	// NackEvicted (version 4): the receiver evicted the segment for a
	// takedown and keeps a tombstone of it: it will never store it again.
	// The sender stops (its record is cancelled, not failed). Sent only on
	// version 4 connections: an older peer, which would refuse the whole
	// NACK as malformed, is answered bad_request instead (NackFor).
	NackEvicted NackCode = "evicted"
	// NackBusy (version 5): the receiver is taking in another copy of the
	// segment right now (another peer's, or the sender's own earlier
	// attempt still arriving). Nothing is wrong with the segment or the
	// receiver: the sender offers it again later, its retry budget
	// untouched, and is then ACKed if the other copy was stored. An older
	// peer is answered quota instead (NackFor), which it also postpones
	// without spending its budget.
	NackBusy NackCode = "busy"
)

var nackCodes = []NackCode{NackQuota, NackChecksum, NackTooLarge, NackBadRequest, NackInternal, NackEvicted, NackBusy}

// NackFor is code as a peer speaking version understands it: evicted
// before version 4 becomes bad_request (the refusal stands; the message
// says why), busy before version 5 becomes quota (retry later, which
// every version postpones without spending the retry budget).
func NackFor(code NackCode, version int) NackCode {
	switch {
	case code == NackEvicted && version < Version4:
		return NackBadRequest
	case code == NackBusy && version < Version5:
		return NackQuota
	}
	return code
}

// Nack is the NACK payload.
type Nack struct {
	// SegmentID is the refused offer's id; empty only when the offer could
	// not be decoded.
	SegmentID string   `json:"segment_id"`
	Code      NackCode `json:"code"`
	// Message is for humans, at most MaxNackMessage bytes; may be empty.
	Message string `json:"message"`
}

// Validate checks the fields' syntax.
func (n Nack) Validate() error {
	if n.SegmentID != "" {
		if err := CheckSegmentID(n.SegmentID); err != nil {
			return badMessage(err)
		}
	}
	if !slices.Contains(nackCodes, n.Code) {
		return fmt.Errorf("%w: unknown nack code %q", ErrBadMessage, n.Code)
	}
	if len(n.Message) > MaxNackMessage {
		return fmt.Errorf("%w: nack message of %d bytes exceeds %d", ErrBadMessage, len(n.Message), MaxNackMessage)
	}
	return nil
}

// TruncateMessage shortens s to at most MaxNackMessage bytes on a rune
// boundary, so a sender can put any error text in a NACK. Invalid UTF-8
// is replaced first: JSON would turn each bad byte into U+FFFD (three
// bytes), and the decoded message could then exceed the limit and make
// the peer refuse the whole NACK.
func TruncateMessage(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxNackMessage {
		return s
	}
	cut := MaxNackMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// EncodeHello, EncodeOffer and EncodeNack validate m and return its JSON
// payload (keys in documented order, no HTML escaping).
func EncodeHello(m Hello) ([]byte, error) { return encode(m, m.Validate()) }

// EncodeOffer: see EncodeHello.
func EncodeOffer(m Offer) ([]byte, error) { return encode(m, m.Validate()) }

// EncodeNack: see EncodeHello.
func EncodeNack(m Nack) ([]byte, error) { return encode(m, m.Validate()) }

func encode(m any, invalid error) ([]byte, error) {
	if invalid != nil {
		return nil, fmt.Errorf("encode %T: %w", m, invalid)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode %T: %w", m, err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// DecodeHello strictly decodes and validates a HELLO payload.
func DecodeHello(p []byte) (Hello, error) {
	// Window starts at absent to tell a missing key from "window":0,
	// which no version allows (a version 1 HELLO must not carry the key).
	const absent = math.MinInt
	m := Hello{Window: absent}
	err := decodeObject(p, map[string]any{"version": &m.Version, "node_id": &m.NodeID, "window": &m.Window}, "window")
	switch {
	case err != nil:
	case m.Window == absent:
		m.Window = 0
		err = m.Validate()
	case m.Version == Version1 || m.Window == 0:
		err = fmt.Errorf("%w: window %d in a version %d HELLO", ErrBadMessage, m.Window, m.Version)
	default:
		err = m.Validate()
	}
	if err != nil {
		return Hello{}, fmt.Errorf("decode hello: %w", err)
	}
	return m, nil
}

// DecodeOffer strictly decodes and validates an OFFER payload.
func DecodeOffer(p []byte) (Offer, error) {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	m, err := decodeOffer(dec)
	if err == nil {
		err = endOfInput(dec)
	}
	if err != nil {
		return Offer{}, fmt.Errorf("decode offer: %w", err)
	}
	return m, nil
}

// decodeOffer reads one offer object from dec (which uses numbers) as
// strictly as decodeObject reads any other message (exactly the keys
// segment_id, size and sha256, none twice, none null) and validates it.
// A QUERY's 4096 offers are read this way from one decoder: decoding each
// with decodeObject cost 190 ms and 15 MB of garbage per QUERY.
func decodeOffer(dec *json.Decoder) (Offer, error) {
	var m Offer
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return m, fmt.Errorf("%w: not a JSON object", ErrBadMessage)
	}
	var seen [3]bool // segment_id, size, sha256
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return m, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		key, _ := tok.(string)
		i := slices.Index(offerKeys, key)
		if i < 0 {
			return m, fmt.Errorf("%w: unknown key %q", ErrBadMessage, key)
		}
		if seen[i] {
			return m, fmt.Errorf("%w: duplicate key %q", ErrBadMessage, key)
		}
		seen[i] = true
		v, err := dec.Token()
		switch {
		case err != nil:
			return m, fmt.Errorf("%w: key %q: %v", ErrBadMessage, key, err)
		case v == nil:
			return m, fmt.Errorf("%w: key %q is null", ErrBadMessage, key)
		}
		switch i {
		case 0, 2:
			str, ok := v.(string)
			if !ok {
				return m, fmt.Errorf("%w: key %q: not a string", ErrBadMessage, key)
			}
			if i == 0 {
				m.SegmentID = str
			} else {
				m.SHA256 = str
			}
		case 1:
			num, ok := v.(json.Number)
			if !ok {
				return m, fmt.Errorf("%w: key %q: not a number", ErrBadMessage, key)
			}
			if m.Size, err = strconv.ParseInt(string(num), 10, 64); err != nil {
				return m, fmt.Errorf("%w: key %q: %s is not an integer", ErrBadMessage, key, num)
			}
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return m, fmt.Errorf("%w: unterminated JSON object", ErrBadMessage)
	}
	for i, key := range offerKeys {
		if !seen[i] {
			return m, fmt.Errorf("%w: missing key %q", ErrBadMessage, key)
		}
	}
	return m, m.Validate()
}

// offerKeys are an OFFER's keys, in the order decodeOffer tracks them.
var offerKeys = []string{"segment_id", "size", "sha256"}

// endOfInput checks that nothing follows the JSON value dec has read.
func endOfInput(dec *json.Decoder) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: data after JSON object", ErrBadMessage)
	}
	return nil
}

// DecodeNack strictly decodes and validates a NACK payload. "message" may
// be omitted; every other key is required.
func DecodeNack(p []byte) (Nack, error) {
	var m Nack
	err := decodeObject(p, map[string]any{"segment_id": &m.SegmentID, "code": &m.Code, "message": &m.Message}, "message")
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		return Nack{}, fmt.Errorf("decode nack: %w", err)
	}
	return m, nil
}

// MaxQuerySegments bounds the offers in one QUERY or HOLDS.
const MaxQuerySegments = 4096

// EncodeSegments encodes a QUERY or HOLDS payload: {"segments":[...]},
// each offer as EncodeOffer writes it. Ids must be distinct.
func EncodeSegments(list []Offer) ([]byte, error) {
	if err := checkSegments(list); err != nil {
		return nil, fmt.Errorf("encode segments: %w", err)
	}
	b := []byte(`{"segments":[`)
	for i, o := range list {
		p, err := EncodeOffer(o)
		if err != nil {
			return nil, fmt.Errorf("encode segments: %w", err)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, p...)
	}
	b = append(b, "]}"...)
	if len(b) > MaxQueryPayload {
		return nil, fmt.Errorf("encode segments: %w: %d bytes, limit %d", ErrBadMessage, len(b), MaxQueryPayload)
	}
	return b, nil
}

// DecodeSegments strictly decodes a QUERY or HOLDS payload: one object
// with exactly the key "segments", an array of at most MaxQuerySegments
// offers, each decoded as strictly as an OFFER, with distinct ids.
func DecodeSegments(p []byte) ([]Offer, error) {
	list, err := decodeSegments(p)
	if err == nil {
		err = checkSegments(list)
	}
	if err != nil {
		return nil, fmt.Errorf("decode segments: %w", err)
	}
	return list, nil
}

// decodeSegments reads {"segments":[offer, ...]} with one decoder, each
// offer as DecodeOffer does.
func decodeSegments(p []byte) ([]Offer, error) {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: not a JSON object", ErrBadMessage)
	}
	var list []Offer
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		key, _ := tok.(string)
		if key != "segments" {
			return nil, fmt.Errorf("%w: unknown key %q", ErrBadMessage, key)
		}
		if seen {
			return nil, fmt.Errorf("%w: duplicate key %q", ErrBadMessage, key)
		}
		seen = true
		v, err := dec.Token()
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadMessage, key, err)
		case v == nil:
			return nil, fmt.Errorf("%w: key %q is null", ErrBadMessage, key)
		case v != json.Delim('['):
			return nil, fmt.Errorf("%w: key %q: not an array", ErrBadMessage, key)
		}
		list = []Offer{}
		for dec.More() {
			if len(list) == MaxQuerySegments {
				return nil, fmt.Errorf("%w: more than %d segments", ErrBadMessage, MaxQuerySegments)
			}
			o, err := decodeOffer(dec)
			if err != nil {
				return nil, fmt.Errorf("decode offer: %w", err)
			}
			list = append(list, o)
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
			return nil, fmt.Errorf("%w: key %q: unterminated array", ErrBadMessage, key)
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, fmt.Errorf("%w: unterminated JSON object", ErrBadMessage)
	}
	if !seen {
		return nil, fmt.Errorf("%w: missing key %q", ErrBadMessage, "segments")
	}
	return list, endOfInput(dec)
}

func checkSegments(list []Offer) error {
	if len(list) > MaxQuerySegments {
		return fmt.Errorf("%w: %d segments, limit %d", ErrBadMessage, len(list), MaxQuerySegments)
	}
	seen := make(map[string]bool, len(list))
	for _, o := range list {
		if seen[o.SegmentID] {
			return fmt.Errorf("%w: segment %q listed twice", ErrBadMessage, o.SegmentID)
		}
		seen[o.SegmentID] = true
	}
	return nil
}

// DecodeAccept validates an ACCEPT payload (the raw segment id, as ACK).
func DecodeAccept(p []byte) (string, error) {
	if err := CheckSegmentID(string(p)); err != nil {
		return "", fmt.Errorf("decode accept: %w", badMessage(err))
	}
	return string(p), nil
}

// DecodeAck validates an ACK payload (the raw segment id) and returns it.
func DecodeAck(p []byte) (string, error) {
	if err := CheckSegmentID(string(p)); err != nil {
		return "", fmt.Errorf("decode ack: %w", badMessage(err))
	}
	return string(p), nil
}

// decodeObject decodes one JSON object into fields, keyed by exact
// (case-sensitive) name. encoding/json alone would accept keys in any case,
// duplicate keys, null for any field and silently keep zero values for
// missing ones; on a wire a peer controls, each of those is an ambiguity, so
// all are refused here. Keys not listed in optional are required.
func decodeObject(p []byte, fields map[string]any, optional ...string) error {
	dec := json.NewDecoder(bytes.NewReader(p))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("%w: not a JSON object", ErrBadMessage)
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		key, _ := tok.(string)
		dst, ok := fields[key]
		if !ok {
			return fmt.Errorf("%w: unknown key %q", ErrBadMessage, key)
		}
		if seen[key] {
			return fmt.Errorf("%w: duplicate key %q", ErrBadMessage, key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("%w: key %q: %v", ErrBadMessage, key, err)
		}
		if string(raw) == "null" {
			return fmt.Errorf("%w: key %q is null", ErrBadMessage, key)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("%w: key %q: %v", ErrBadMessage, key, err)
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return fmt.Errorf("%w: unterminated JSON object", ErrBadMessage)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: data after JSON object", ErrBadMessage)
	}
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		if !seen[key] && !slices.Contains(optional, key) {
			return fmt.Errorf("%w: missing key %q", ErrBadMessage, key)
		}
	}
	return nil
}
