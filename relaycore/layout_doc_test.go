package relaycore

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// docs/layout.md promises that a reader can decode every item from the doc
// alone. This file holds such a reader: docPage and docDigest are written
// from the doc's words, not from the code (they share no helper with it).
// The tests check the doc's worked examples against that reader and
// against the engine, and the reader against pages the engine writes.

// layoutDoc returns the fenced block of docs/layout.md whose info string
// is info ("hex page", "json page", ...).
func layoutDoc(t *testing.T, info string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/layout.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n```"+info+"\n")
	if !ok {
		t.Fatalf("docs/layout.md has no ```%s block", info)
	}
	block, _, ok := strings.Cut(rest, "\n```")
	if !ok {
		t.Fatalf("docs/layout.md: ```%s block is not closed", info)
	}
	return block
}

// docHex reads an annotated hex listing: on each line, the hex bytes come
// before the first run of two spaces.
func docHex(t *testing.T, block string) []byte {
	t.Helper()
	var out []byte
	for _, line := range strings.Split(block, "\n") {
		field, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
		for _, h := range strings.Fields(field) {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != 1 {
				t.Fatalf("docs/layout.md hex listing: %q in %q", h, line)
			}
			out = append(out, b[0])
		}
	}
	return out
}

// docPageJSON is the decoded form the doc's "json page" block uses.
type docPageJSON struct {
	First    uint64 `json:"first"`
	CommitMS int64  `json:"commit_ms"`
	Tag      string `json:"tag"`
	Target   string `json:"target"`
	Rows     []struct {
		Seq  uint64 `json:"seq"`
		Puts []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"puts"`
		Deletes []string `json:"deletes"`
	} `json:"rows"`
}

// docReader decodes what the doc calls uvarints, zig-zag varints and
// length-prefixed bytes.
type docReader struct {
	b   []byte
	err error
}

func (r *docReader) fail(why string) {
	if r.err == nil {
		r.err = errors.New(why)
	}
}

// uvarint: 7 bits per byte, least significant group first, high bit set on
// every byte but the last.
func (r *docReader) uvarint() uint64 {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		if len(r.b) == 0 {
			r.fail("truncated uvarint")
			return 0
		}
		c := r.b[0]
		r.b = r.b[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	r.fail("uvarint too long")
	return 0
}

// zigzag: n >= 0 stored as 2n, n < 0 as -2n-1.
func (r *docReader) zigzag() int64 {
	u := r.uvarint()
	if u%2 == 0 {
		return int64(u / 2)
	}
	return -int64(u/2) - 1
}

func (r *docReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.fail("truncated bytes")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// docPage decodes a row page by the rules of docs/layout.md, "Row pages".
func docPage(raw []byte) (Page, error) {
	if len(raw) == 0 {
		return Page{}, errors.New("empty")
	}
	format := raw[0]
	r := &docReader{b: raw[1:]}
	compressed := false
	switch format {
	case 1:
	case 2:
		if len(r.b) == 0 {
			return Page{}, errors.New("no flags")
		}
		flags := r.b[0]
		r.b = r.b[1:]
		if flags&^1 != 0 {
			return Page{}, fmt.Errorf("flags %#x", flags)
		}
		compressed = flags&1 != 0
	default:
		return Page{}, fmt.Errorf("format %d", format)
	}
	p := Page{First: r.uvarint(), CommitMS: r.zigzag(), Tag: string(r.bytes()), Target: Partition(r.bytes())}
	if compressed {
		n := r.uvarint()
		section, err := io.ReadAll(flate.NewReader(bytes.NewReader(r.b)))
		if err != nil || uint64(len(section)) != n {
			return Page{}, fmt.Errorf("row section: %d bytes, declared %d: %v", len(section), n, err)
		}
		r.b = section
	}
	prev := ""
	key := func() string {
		if format == 1 {
			return string(r.bytes())
		}
		s := r.uvarint()
		suffix := r.bytes()
		if s > uint64(len(prev)) {
			r.fail("shared prefix longer than the previous key")
			return ""
		}
		prev = prev[:s] + string(suffix)
		return prev
	}
	rows := r.uvarint()
	for i := uint64(0); i < rows && r.err == nil; i++ {
		row := Row{Target: p.Target, Seq: p.First + i, CommitMS: p.CommitMS}
		for range r.uvarint() {
			k := key()
			row.Puts = append(row.Puts, KV{Key: k, Value: r.bytes()})
		}
		for range r.uvarint() {
			row.Deletes = append(row.Deletes, key())
		}
		p.Rows = append(p.Rows, row)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	return p, r.err
}

// docDigestInput is what docs/layout.md says the idempotency digest hashes.
func docDigestInput(rows []Row) []byte {
	var b []byte
	uv := func(v uint64) {
		for v >= 0x80 {
			b = append(b, byte(v)|0x80)
			v >>= 7
		}
		b = append(b, byte(v))
	}
	str := func(s []byte) { uv(uint64(len(s))); b = append(b, s...) }
	uv(uint64(len(rows)))
	for _, r := range rows {
		str([]byte(r.Target))
		uv(uint64(len(r.Puts)))
		for _, kv := range r.Puts {
			str([]byte(kv.Key))
			str(kv.Value)
		}
		uv(uint64(len(r.Deletes)))
		for _, k := range r.Deletes {
			str([]byte(k))
		}
	}
	return b
}

// samePage compares pages by content (nil and empty values and lists
// alike).
func samePage(a, b Page) bool {
	norm := func(p Page) Page {
		p.Key = ""
		rows := make([]Row, len(p.Rows))
		for i, r := range p.Rows {
			r.Puts = append([]KV{}, r.Puts...)
			for j := range r.Puts {
				r.Puts[j].Value = append([]byte{}, r.Puts[j].Value...)
			}
			r.Deletes = append([]string{}, r.Deletes...)
			rows[i] = r
		}
		p.Rows = rows
		return p
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func TestLayoutDocExamples(t *testing.T) {
	t.Run("page", func(t *testing.T) {
		raw := docHex(t, layoutDoc(t, "hex page"))
		var want docPageJSON
		if err := json.Unmarshal([]byte(layoutDoc(t, "json page")), &want); err != nil {
			t.Fatal(err)
		}
		p := Page{First: want.First, CommitMS: want.CommitMS, Tag: want.Tag, Target: Partition(want.Target)}
		for _, r := range want.Rows {
			row := Row{Target: p.Target, Seq: r.Seq, CommitMS: p.CommitMS, Deletes: r.Deletes}
			for _, kv := range r.Puts {
				row.Puts = append(row.Puts, KV{Key: kv.Key, Value: []byte(kv.Value)})
			}
			p.Rows = append(p.Rows, row)
		}
		byDoc, err := docPage(raw)
		if err != nil || !samePage(byDoc, p) {
			t.Fatalf("the doc's rules decode the doc's page to\n%+v (%v)\nthe doc says\n%+v", byDoc, err, p)
		}
		byCode, err := decodePage(layout.PageKey(p.First), raw)
		if err != nil || !samePage(byCode, p) {
			t.Fatalf("decodePage: %+v (%v)", byCode, err)
		}
		if enc := encodePage(p); !bytes.Equal(enc, raw) {
			t.Fatalf("the engine encodes the doc's page as\n%x\nthe doc says\n%x", enc, raw)
		}
	})
	t.Run("digest", func(t *testing.T) {
		rows := []Row{{Target: "t", Puts: []KV{{Key: "a", Value: []byte("hi")}}, Deletes: []string{"b"}}}
		input := docHex(t, layoutDoc(t, "hex digest-input"))
		if got := docDigestInput(rows); !bytes.Equal(got, input) {
			t.Fatalf("the doc's rules give %x, its listing %x", got, input)
		}
		want := strings.TrimSpace(layoutDoc(t, "text digest"))
		if sum := sha256.Sum256(input); hex.EncodeToString(sum[:]) != want {
			t.Fatalf("sha256 of the listing = %x, the doc says %s", sum, want)
		}
		if got := rowsDigest(rows); got != want {
			t.Fatalf("rowsDigest = %s, the doc says %s", got, want)
		}
	})
	t.Run("target state", func(t *testing.T) {
		// The doc's example decodes, and the engine writes it back with the
		// same fields: none added, so every zero field is omitted.
		example := layoutDoc(t, "json target-state")
		r, err := decodeTargetRec("t", []byte(example), true)
		if err != nil {
			t.Fatal(err)
		}
		var byDoc, byEngine map[string]any
		if err := json.Unmarshal([]byte(example), &byDoc); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(encodeTargetRec(r), &byEngine); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(byEngine, byDoc) {
			t.Fatalf("the engine writes the doc's example as\n%s\nthe doc says\n%s", encodeTargetRec(r), example)
		}
		// "Absent means {"state":"active"} with zeros": a fresh record is
		// written as just that, and records from before the zero fields
		// were omitted read the same.
		if got := string(encodeTargetRec(targetRec{State: StateActive})); got != `{"state":"active"}` {
			t.Fatalf("a zero record is written as %s", got)
		}
		old, err := decodeTargetRec("t", []byte(`{"state":"active","since_ms":0,"done":0}`), true)
		if err != nil || !reflect.DeepEqual(old, targetRec{Target: "t", State: StateActive}) {
			t.Fatalf("an old record with zero fields decodes as %+v (%v)", old, err)
		}
	})
	t.Run("folded figures", func(t *testing.T) {
		// The os and rs examples decode, their folded entries read as the
		// doc says, and the engine writes them back field for field.
		roundTrip := func(info string, v any) {
			t.Helper()
			example := layoutDoc(t, info)
			if err := json.Unmarshal([]byte(example), v); err != nil {
				t.Fatal(err)
			}
			var byDoc, byEngine map[string]any
			if err := json.Unmarshal([]byte(example), &byDoc); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(encodeJSON(v), &byEngine); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(byEngine, byDoc) {
				t.Fatalf("the engine writes the doc's %s example as\n%s\nthe doc says\n%s", info, encodeJSON(v), example)
			}
		}
		var o OutboxState
		roundTrip("json os", &o)
		e, ok := o.enqOf("orders-eu")
		if want := (targetEnq{N: 1200, Last: 5011, LastMS: 1800000000123, Runs: [][3]int64{{4990, 5000, 1800000000001}, {5001, 5011, 1800000000123}}, Dropped: true}); !ok || !reflect.DeepEqual(e, want) {
			t.Fatalf("os folds orders-eu as %+v (%v), want %+v", e, ok, want)
		}
		var rs RelayState
		roundTrip("json rs", &rs)
		r := targetRec{Target: "orders-eu", State: StateActive, Done: 1, Held: 3}
		rs.overlayDone(&r)
		if want := (targetRec{Target: "orders-eu", State: StateActive, Done: 1150, Through: 4989, Next: 4990, NextMS: 1800000000001, Held: 3}); r != want {
			t.Fatalf("rs folds orders-eu over its record as %+v, want %+v", r, want)
		}
	})
	t.Run("blocked name", func(t *testing.T) {
		// "\u0000dP8" for t\xff: U+0000 then unpadded base64url.
		b, err := base64.RawURLEncoding.DecodeString("dP8")
		if err != nil || string(b) != "t\xff" {
			t.Fatalf("the doc's example: %q %v", b, err)
		}
		var rs RelayState
		if err := json.Unmarshal([]byte(`{"blocked":["\u0000dP8","tenant-3"]}`), &rs); err != nil ||
			!reflect.DeepEqual(rs.Blocked, []Partition{"t\xff", "tenant-3"}) {
			t.Fatalf("rs decodes the doc's example as %q (%v)", rs.Blocked, err)
		}
	})
}

// The doc's reader decodes whatever the engine writes (format 2,
// compressed or not, and the format-1 golden page) to what decodePage
// returns, and the doc's digest rule gives rowsDigest's input.
func TestLayoutDocDecodesEngineOutput(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	v1, _ := hex.DecodeString(pageV1Golden)
	pages := [][]byte{v1}
	for range 200 {
		n := 1 + rng.IntN(40)
		p := Page{First: 1 + rng.Uint64N(1<<40), CommitMS: rng.Int64N(1<<42) - 1<<20, Tag: fmt.Sprintf("%012x.%d", rng.Uint64N(1<<48), rng.IntN(9)), Target: Partition(fmt.Sprintf("tgt-\xff%d", rng.IntN(500)))}
		var rows []Row
		for range n {
			var r Row
			for range rng.IntN(4) {
				v := bytes.Repeat([]byte(fmt.Sprintf(`{"n":%d}`, rng.IntN(10))), rng.IntN(60))
				r.Puts = append(r.Puts, KV{Key: fmt.Sprintf("user/%d", rng.IntN(1e6)), Value: v})
			}
			for range rng.IntN(3) {
				r.Deletes = append(r.Deletes, fmt.Sprintf("user/%d/x", rng.IntN(1e6)))
			}
			if len(r.Puts)+len(r.Deletes) == 0 {
				r.Deletes = []string{"k"}
			}
			rows = append(rows, r)
		}
		p.Rows = rows
		pages = append(pages, encodePage(p))
		if got := docDigestInput(rows); rowsDigest(rows) != fmt.Sprintf("%x", sha256.Sum256(got)) {
			t.Fatalf("the doc's digest rule disagrees with rowsDigest for %+v", rows)
		}
	}
	compressed := 0
	for _, raw := range pages {
		if raw[0] == 2 && raw[1]&1 != 0 {
			compressed++
		}
		byCode, err := decodePage("k", raw)
		if err != nil {
			t.Fatal(err)
		}
		byDoc, err := docPage(raw)
		if err != nil || !samePage(byDoc, byCode) {
			t.Fatalf("page %x: the doc's rules give\n%+v (%v)\nDecodePage\n%+v", raw, byDoc, err, byCode)
		}
	}
	if compressed == 0 || compressed == len(pages)-1 {
		t.Fatalf("%d of %d pages compressed: both kinds must be covered", compressed, len(pages))
	}
}
