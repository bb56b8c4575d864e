package api

import (
	"bytes"
	"encoding/base64"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore"
)

// parseRowsFast decodes the one enqueue body producers send,
//
//	{"rows":[{"target":"...","puts":[{"key":"...","value":"<base64>"}],"deletes":["..."]}]}
//
// (whitespace wherever JSON allows it; members in any order; puts and
// deletes optional or null, as encoding/json writes an EnqueueRequest's
// nil slices) by a scanner over the body's bytes, with no reflection and a
// handful of allocations per body rather than several per row. It returns
// exactly what parseRowsJSON returns for the body, or false, and then
// parseRowsJSON decides: on anything else (an escape in a string, a member
// name not exactly as above or given twice, which encoding/json would match
// by case or take the last of, an unknown member, a null or number where a
// string, object or array of rows is expected, a missing target, key or
// value, trailing data, invalid UTF-8) and on every refusal (no rows, too
// many, a bad target name or base64 value), so every error's text is
// encoding/json's path's, unchanged. FuzzParseRows checks the two agree.
//
// The rows it returns share three allocations, none aliasing the body:
// every value is a slice of one buffer of the decoded values, every key and
// delete a substring of one string, and every row's puts a slice of one
// []KV, each slice's capacity cut to its length so an append to one cannot
// write over the next. Targets are strings of their own (a few distinct
// per body), as they may outlive the request.
func parseRowsFast(body []byte, maxRows int) ([]relaycore.Row, bool) {
	s := fastScans.Get().(*fastScan)
	defer s.release()
	s.b = body
	if !s.parse(maxRows) {
		return nil, false
	}
	return s.build()
}

// fastScans holds fastScan's working slices (offsets only: no pointer into
// a body outlives its parse) between requests.
var fastScans = sync.Pool{New: func() any { return new(fastScan) }}

// strictBase64 is the values' encoding: parseRowsJSON's
// base64.StdEncoding.Strict(), made once.
var strictBase64 = base64.StdEncoding.Strict()

// A span is a string's bytes in the body, between its quotes.
type span struct{ from, to int }

func (p span) len() int { return p.to - p.from }

type fastRow struct {
	target     span
	puts, dels int  // end of the row's puts and deletes in fastScan's
	delsArray  bool // "deletes" was an array (possibly empty), not absent or null
}

type fastPut struct{ key, value span }

type fastScan struct {
	b    []byte
	i    int // the next byte to read
	rows []fastRow
	puts []fastPut
	dels []span
}

func (s *fastScan) release() {
	s.b, s.i = nil, 0
	s.rows, s.puts, s.dels = s.rows[:0], s.puts[:0], s.dels[:0]
	fastScans.Put(s)
}

// plain holds the bytes a string takes as they are: not the quote, the
// backslash, a control character, or the start of a multi-byte UTF-8
// sequence (taken, but checked).
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return
}()

// ws skips JSON's whitespace.
func (s *fastScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and then c, reporting whether c was there.
func (s *fastScan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// null skips whitespace and then the literal null, reporting whether it
// was there (whatever follows it is the caller's next token).
func (s *fastScan) null() bool {
	s.ws()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// str reads a string without escapes (false on any other value, an escape
// or a control character). Its bytes are what encoding/json would decode
// it to: the same bytes, as long as they are valid UTF-8, which is checked
// when any is not ASCII.
func (s *fastScan) str() (span, bool) {
	if !s.next('"') {
		return span{}, false
	}
	ascii := true
	for j := s.i; j < len(s.b); j++ {
		c := s.b[j]
		if plain[c] {
			continue
		}
		switch {
		case c == '"':
			p := span{s.i, j}
			if !ascii && !utf8.Valid(s.b[p.from:p.to]) {
				return span{}, false
			}
			s.i = j + 1
			return p, true
		case c >= utf8.RuneSelf:
			ascii = false
		default:
			return span{}, false
		}
	}
	return span{}, false
}

// object reads an object, calling member for each member's name (its
// bytes, unescaped) with the scanner just past the name's colon; member
// reads the value and reports whether to go on.
func (s *fastScan) object(member func(name []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		name, ok := s.str()
		if !ok || !s.next(':') || !member(s.b[name.from:name.to]) {
			return false
		}
		if !s.next(',') {
			return s.next('}')
		}
	}
}

// array reads an array, calling elem to read each element.
func (s *fastScan) array(elem func() bool) bool {
	if !s.next('[') {
		return false
	}
	if s.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if !s.next(',') {
			return s.next(']')
		}
	}
}

// parse reads the whole body into s.rows, s.puts and s.dels: 1..maxRows
// rows, nothing after the object but whitespace.
func (s *fastScan) parse(maxRows int) bool {
	seen := false
	ok := s.object(func(name []byte) bool {
		if string(name) != "rows" || seen {
			return false
		}
		seen = true
		return s.array(func() bool { return len(s.rows) < maxRows && s.row() })
	})
	s.ws()
	return ok && len(s.rows) > 0 && s.i == len(s.b)
}

// member is the bit of name among names (1 for the first, 2, 4, ...),
// marked in seen, or 0 when name is none of them or was seen already
// (encoding/json would take the last of two: parseRowsJSON decides).
func member(name []byte, seen *uint8, names ...string) uint8 {
	for i, n := range names {
		if string(name) == n {
			bit := uint8(1) << i
			if *seen&bit != 0 {
				return 0
			}
			*seen |= bit
			return bit
		}
	}
	return 0
}

func (s *fastScan) row() bool {
	var r fastRow
	var seen uint8
	const target, puts, dels = 1, 2, 4
	ok := s.object(func(name []byte) bool {
		var ok bool
		switch member(name, &seen, "target", "puts", "deletes") {
		case target:
			r.target, ok = s.str()
		case puts:
			ok = s.null() || s.array(s.put)
		case dels:
			if s.null() {
				return true
			}
			r.delsArray = true
			ok = s.array(func() bool {
				d, ok := s.str()
				if ok {
					s.dels = append(s.dels, d)
				}
				return ok
			})
		}
		return ok
	})
	if !ok || seen&target == 0 {
		return false
	}
	r.puts, r.dels = len(s.puts), len(s.dels)
	s.rows = append(s.rows, r)
	return true
}

func (s *fastScan) put() bool {
	var p fastPut
	var seen uint8
	const key, value = 1, 2
	ok := s.object(func(name []byte) bool {
		var ok bool
		switch member(name, &seen, "key", "value") {
		case key:
			p.key, ok = s.str()
		case value:
			p.value, ok = s.str()
		}
		return ok
	})
	if !ok || seen != key|value {
		return false
	}
	s.puts = append(s.puts, p)
	return true
}

// build makes the rows parse read, or reports false for a target name or
// a value parseRowsJSON refuses.
func (s *fastScan) build() ([]relaycore.Row, bool) {
	nv, nt := 0, 0
	for _, p := range s.puts {
		nv += strictBase64.DecodedLen(p.value.len())
		nt += p.key.len()
	}
	for _, d := range s.dels {
		nt += d.len()
	}
	values := make([]byte, nv)
	var sb strings.Builder
	sb.Grow(nt)
	for _, p := range s.puts {
		sb.Write(s.b[p.key.from:p.key.to])
	}
	for _, d := range s.dels {
		sb.Write(s.b[d.from:d.to])
	}
	text := sb.String()
	kvs := make([]relaycore.KV, len(s.puts))
	vo, to := 0, 0
	for i, p := range s.puts {
		n, err := strictBase64.Decode(values[vo:], s.b[p.value.from:p.value.to])
		if err != nil {
			return nil, false
		}
		kvs[i] = relaycore.KV{Key: text[to : to+p.key.len()], Value: values[vo : vo+n : vo+n]}
		vo, to = vo+n, to+p.key.len()
	}
	dels := make([]string, len(s.dels))
	for i, d := range s.dels {
		dels[i] = text[to : to+d.len()]
		to += d.len()
	}

	rows := make([]relaycore.Row, len(s.rows))
	var recent [8]relaycore.Partition // distinct targets, most recent first
	pi, di := 0, 0
	for i, r := range s.rows {
		t := s.target(r.target, &recent)
		if relaycore.TargetNameProblem(string(t)) != "" {
			return nil, false
		}
		rows[i].Target = t
		if r.puts > pi {
			rows[i].Puts = kvs[pi:r.puts:r.puts]
		}
		if r.delsArray {
			rows[i].Deletes = dels[di:r.dels:r.dels]
		}
		pi, di = r.puts, r.dels
	}
	return rows, true
}

// target is the target name at p, one of recent when it is there (bodies
// name a few targets many times), else a new string put first in recent.
func (s *fastScan) target(p span, recent *[8]relaycore.Partition) relaycore.Partition {
	name := s.b[p.from:p.to]
	for k, t := range recent {
		if string(t) == string(name) {
			copy(recent[1:k+1], recent[:k])
			recent[0] = t
			return t
		}
	}
	t := relaycore.Partition(name)
	copy(recent[1:], recent[:len(recent)-1])
	recent[0] = t
	return t
}
