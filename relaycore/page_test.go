package relaycore

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// pageV1Golden is a format-1 page as the engine wrote it before format 2
// (produced by that encoder): outboxes may still hold such pages, so they
// must keep decoding.
const pageV1Golden = "012af6c1e285e3680e3966326334316430613762652e300874656e616e742d33020206757365722f31077b226e223a317d06757365722f32000106757365722f33000106757365722f31"

func TestPageFormat1StillDecodes(t *testing.T) {
	raw, err := hex.DecodeString(pageV1Golden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodePage(layout.PageKey(42), raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Page{Key: layout.PageKey(42), First: 42, CommitMS: 1_800_000_000_123, Tag: "9f2c41d0a7be.0", Target: "tenant-3", Rows: []Row{
		{Puts: []KV{{Key: "user/1", Value: []byte(`{"n":1}`)}, {Key: "user/2"}}, Deletes: []string{"user/3"}},
		{Deletes: []string{"user/1"}},
	}}
	if d := pageDiff(want, got); d != "" {
		t.Fatal(d)
	}
	// A page read in format 1 is rewritten (partial delivery) in format 2.
	again, err := decodePage(got.Key, encodePage(got))
	if err != nil || raw[0] != pageFormat1 || encodePage(got)[0] != pageFormat2 {
		t.Fatalf("re-encode: %v", err)
	}
	if d := pageDiff(got, again); d != "" {
		t.Fatal(d)
	}
	for i := 0; i < len(raw); i++ {
		if _, err := decodePage("k", raw[:i]); err == nil {
			t.Fatalf("format 1 truncated at %d decoded", i)
		}
	}
}

func TestPageRoundTrip(t *testing.T) {
	p := Page{Key: layout.PageKey(7), First: 7, CommitMS: 1_800_000_000_123, Tag: "abc.0", Target: "tgt",
		Rows: []Row{
			{Puts: []KV{{Key: "a", Value: []byte("1")}, {Key: "b", Value: nil}}, Deletes: []string{"c"}},
			{Deletes: []string{"a"}},
		}}
	raw := encodePage(p)
	if raw[0] != pageFormat2 || raw[1] != 0 {
		t.Fatalf("a small page is format 2 uncompressed, got % x", raw[:2])
	}
	got, err := decodePage(p.Key, raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.First != 7 || got.Last() != 8 || got.Tag != "abc.0" || got.Target != "tgt" || got.CommitMS != p.CommitMS {
		t.Fatalf("header %+v", got)
	}
	if got.Rows[1].Seq != 8 || got.Rows[1].Target != "tgt" || got.Rows[1].CommitMS != p.CommitMS {
		t.Fatalf("rows %+v", got.Rows)
	}
	if d := pageDiff(p, got); d != "" {
		t.Fatal(d)
	}
	if !bytes.Equal(encodePage(got), raw) {
		t.Fatal("re-encoding differs")
	}
	for i := 0; i < len(raw); i++ {
		if _, err := decodePage("k", raw[:i]); err == nil {
			t.Fatalf("truncation at %d decoded", i)
		}
	}
}

// Random pages round-trip in both body forms: keys with and without shared
// prefixes, empty values, deletes, compressible and incompressible values.
func TestPageRoundTripRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	compressed := 0
	for i := 0; i < 300; i++ {
		p := randomPage(rng)
		raw := encodePage(p)
		if raw[1]&pageDeflate != 0 {
			compressed++
		}
		got, err := decodePage(p.Key, raw)
		if err != nil {
			t.Fatalf("seed %d page %d: %v", seed, i, err)
		}
		if d := pageDiff(p, got); d != "" {
			t.Fatalf("seed %d page %d: %s", seed, i, d)
		}
		if full := pageHeaderMax(p.Tag, p.Target) + rowsFullLen(p.Rows); len(raw) > full {
			t.Fatalf("seed %d page %d: %d bytes, more than with full keys uncompressed (%d)", seed, i, len(raw), full)
		}
	}
	if compressed == 0 || compressed == 300 {
		t.Fatalf("seed %d: %d of 300 pages compressed; the generator should give both forms", seed, compressed)
	}
}

// The figures the cost section of docs/engine.md rests on: a page of
// 25 record-like 200-byte rows compresses to about a quarter; random bytes
// do not compress and are stored as is, with shared key prefixes only.
func TestPageCompressesRecords(t *testing.T) {
	records, random := Page{First: 1, Tag: "9f2c41d0a7be.0", Target: "tgt-000"}, Page{First: 1, Tag: "9f2c41d0a7be.0", Target: "tgt-000"}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 25; i++ {
		key := fmt.Sprintf("user/%011d", 4*i)
		records.Rows = append(records.Rows, Row{Puts: []KV{{Key: key, Value: recordValue(rng, i)}}})
		v := make([]byte, 200)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		random.Rows = append(random.Rows, Row{Puts: []KV{{Key: key, Value: v}}})
	}
	full := rowsFullLen(records.Rows)
	rec := encodePage(records)
	if rec[1] != pageDeflate || len(rec) > full*2/5 {
		t.Fatalf("records: flags %d, %d bytes of %d; want compressed to under 40%%", rec[1], len(rec), full)
	}
	// DEFLATE barely shortens random bytes (it may, by a few bytes, which
	// is then kept); a row takes at most 209 bytes, its key sharing its
	// prefix with the previous row's.
	rnd := encodePage(random)
	if per := (len(rnd) - 40) / 25; per > 209 {
		t.Fatalf("random 200-byte rows take %d bytes each, flags %d; want at most 209", per, rnd[1])
	}
	t.Logf("25 rows: records %d bytes (full keys, uncompressed %d); random %d bytes, flags %d", len(rec), full, len(rnd), rnd[1])
}

func TestDecodePageRejects(t *testing.T) {
	good := Page{First: 1, Tag: "t", Target: "x", Rows: []Row{{Puts: []KV{{Key: "user/1", Value: bytes.Repeat([]byte("ab"), 600)}}}, {Deletes: []string{"user/2"}}}}
	raw := encodePage(good)
	if raw[1] != pageDeflate {
		t.Fatal("fixture should be compressed")
	}
	hdr := assemblePage(1, 0, "t", "x", 0, nil)
	deflate := func(section []byte) []byte {
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, flate.BestSpeed)
		w.Write(section)
		w.Close()
		return b.Bytes()
	}
	section := appendRowSection(nil, good.Rows)
	withBody := func(flags byte, body []byte) []byte {
		out := append(bytes.Clone(hdr), body...)
		out[1] = flags
		return out
	}
	deflated := func(declared int, stream []byte) []byte {
		return withBody(pageDeflate, append(binary.AppendUvarint(nil, uint64(declared)), stream...))
	}
	cases := map[string][]byte{
		"empty":               nil,
		"unknown format":      append([]byte{3}, raw[1:]...),
		"unknown flags":       append([]byte{pageFormat2, 0x82}, raw[2:]...),
		"declared too long":   deflated(len(section)+1, deflate(section)),
		"declared too short":  deflated(len(section)-1, deflate(section)),
		"declared beyond cap": deflated(maxPageRawBytes+1, deflate(section)),
		"bomb ratio":          deflated(100_000, []byte{1, 2, 3}),
		"bytes after stream":  deflated(len(section), append(deflate(section), 0)),
		"corrupt stream":      deflated(len(section), bytes.Repeat([]byte{0xff}, 40)),
		"bytes after rows":    withBody(0, append(bytes.Clone(section), 0)),
		"shared beyond prev":  withBody(0, []byte{1, 1, 3, 1, 'k', 0, 0}),
		"zero rows":           withBody(0, []byte{0}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodePage("k", b); err == nil {
				t.Fatal("decoded")
			}
		})
	}
	if _, err := decodePage("k", deflated(len(section), deflate(section))); err != nil {
		t.Fatalf("a well-formed hand-built page: %v", err)
	}
}

func FuzzDecodePage(f *testing.F) {
	raw, _ := hex.DecodeString(pageV1Golden)
	f.Add(raw)
	f.Add(encodePage(Page{First: 1, CommitMS: 5, Tag: "t", Target: "x", Rows: []Row{{Puts: []KV{{Key: "k", Value: []byte("v")}}}}}))
	f.Add(encodePage(Page{First: 1 << 60, Tag: "", Target: "y", Rows: []Row{{Deletes: []string{"a", "b"}}, {Puts: []KV{{Key: "c"}}}}}))
	rng := rand.New(rand.NewPCG(3, 3))
	for i := 0; i < 4; i++ {
		f.Add(encodePage(randomPage(rng)))
	}
	f.Add([]byte{1, 0x80})
	f.Add([]byte{2, 1, 1, 0, 0, 0, 0xff, 0xff, 0x03})
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := decodePage("k", raw)
		if err != nil {
			return
		}
		again, err := decodePage("k", encodePage(p))
		if err != nil {
			t.Fatalf("decoded page does not re-encode: %v", err)
		}
		if d := pageDiff(p, again); d != "" {
			t.Fatalf("decoded page does not round-trip: %s", d)
		}
	})
}

// A 200-byte row costs about 206 bytes with full keys (the target is
// stored once per page, lengths are varints), less with a shared prefix;
// rowEncodedLen is an upper bound of the real encoding.
func TestRowEncodingIsCompact(t *testing.T) {
	r := Row{Puts: []KV{{Key: "user/000123/profile", Value: bytes.Repeat([]byte("x"), 181)}}}
	if n := rowEncodedLen(r); n > 206 {
		t.Fatalf("200-byte row bound is %d bytes", n)
	}
	if n, _ := rowSectionLen(r, ""); n > rowEncodedLen(r) {
		t.Fatalf("row encodes to %d bytes, above its bound %d", n, rowEncodedLen(r))
	}
	if n, _ := rowSectionLen(r, "user/000122/profile"); n > 205-9 {
		t.Fatalf("200-byte row after a key sharing 10 bytes encodes to %d bytes", n)
	}
}

// recordValue is a 200-byte JSON user record with random field values (the
// shape bench/cost_test.go uses).
func recordValue(rng *rand.Rand, i int) []byte {
	words := []string{"alpha", "bravo", "delta", "echo", "kilo", "lima", "mike", "oscar", "papa", "romeo"}
	v := fmt.Sprintf(`{"id":"u%011d","email":"user%d@example.com","balance_cents":%d,"updated_at":"2026-11-%02dT%02d:%02d:00Z","note":"`,
		i, rng.IntN(100000), rng.IntN(10000000), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60))
	for len(v) < 198 {
		v += words[rng.IntN(len(words))] + " "
	}
	return []byte(v[:198] + `"}`)
}

func randomPage(rng *rand.Rand) Page {
	p := Page{Key: layout.PageKey(1), First: 1 + rng.Uint64N(1<<40), CommitMS: rng.Int64N(1<<42) - 1<<41,
		Tag: fmt.Sprintf("%012x.%d", rng.Uint64N(1<<48), rng.IntN(40)), Target: Partition(fmt.Sprintf("tgt-%d", rng.IntN(100)))}
	compressible := rng.IntN(2) == 0
	n := 1 + rng.IntN(40)
	for i := 0; i < n; i++ {
		var r Row
		used := map[string]bool{}
		key := func() string {
			for {
				var k string
				switch rng.IntN(3) {
				case 0:
					k = fmt.Sprintf("user/%011d", rng.IntN(1000))
				case 1:
					k = fmt.Sprintf("order/%d/item/%d", rng.IntN(50), rng.IntN(9))
				default:
					b := make([]byte, 1+rng.IntN(8))
					for j := range b {
						b[j] = byte(rng.Uint32())
					}
					k = string(b)
				}
				if !used[k] {
					used[k] = true
					return k
				}
			}
		}
		for j := rng.IntN(4); j > 0; j-- {
			var v []byte
			switch {
			case rng.IntN(5) == 0:
				// empty value
			case compressible:
				v = recordValue(rng, i)
			default:
				v = make([]byte, rng.IntN(300))
				for k := range v {
					v[k] = byte(rng.Uint32())
				}
			}
			r.Puts = append(r.Puts, KV{Key: key(), Value: v})
		}
		for j := rng.IntN(3); j > 0 || len(r.Puts) == 0 && j >= 0; j-- {
			r.Deletes = append(r.Deletes, key())
		}
		p.Rows = append(p.Rows, r)
	}
	return p
}

func rowsFullLen(rows []Row) int {
	n := 0
	for _, r := range rows {
		n += rowEncodedLen(r)
	}
	return n
}

// pageDiff describes the first difference between two pages ("" if none),
// treating nil and empty values alike.
func pageDiff(a, b Page) string {
	if a.First != b.First || a.CommitMS != b.CommitMS || a.Tag != b.Tag || a.Target != b.Target || len(a.Rows) != len(b.Rows) {
		return fmt.Sprintf("header or row count: %d/%d/%q/%q/%d vs %d/%d/%q/%q/%d", a.First, a.CommitMS, a.Tag, a.Target, len(a.Rows), b.First, b.CommitMS, b.Tag, b.Target, len(b.Rows))
	}
	for i := range a.Rows {
		ra, rb := a.Rows[i], b.Rows[i]
		if len(ra.Puts) != len(rb.Puts) || strings.Join(ra.Deletes, "\x00") != strings.Join(rb.Deletes, "\x00") || len(ra.Deletes) != len(rb.Deletes) {
			return fmt.Sprintf("row %d: %+v vs %+v", i, ra, rb)
		}
		for j := range ra.Puts {
			if ra.Puts[j].Key != rb.Puts[j].Key || !bytes.Equal(ra.Puts[j].Value, rb.Puts[j].Value) {
				return fmt.Sprintf("row %d put %d: %q vs %q", i, j, ra.Puts[j].Key, rb.Puts[j].Key)
			}
		}
	}
	return ""
}

// Pages planned for one target hold every row once, in seq order, within
// the page budget, filled close below it: compressible rows are packed well
// beyond what fits uncompressed; incompressible ones to within a row of the
// budget. A page's rows with full keys always fit the store's item limit,
// so rewriting its remaining rows after a partial delivery cannot fail.
func TestPlanPagesFillBelowBudget(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	dynamoLike := Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 787}
	for _, tc := range []struct {
		name        string
		caps        Capabilities
		cfg         EnqueueConfig
		compress    bool
		minFill     float64 // of the budget, every page but a target's last
		minRowsPage int     // every page but a target's last
	}{
		{name: "records", caps: dynamoLike, compress: true, minFill: 0.95, minRowsPage: 100},
		{name: "random", caps: dynamoLike, minFill: 0.9, minRowsPage: 30},
		{name: "records/small-item-limit", caps: Capabilities{MaxItemBytes: 3000, ItemOverhead: 32}, compress: true, minRowsPage: 12},
		{name: "records/unlimited", caps: Capabilities{}, cfg: EnqueueConfig{PageBytes: 2048}, compress: true, minFill: 0.9, minRowsPage: 30},
		// A store that takes pages uncompressed (infra/postgres): filled as
		// close to the budget with the rows as they are.
		{name: "records/uncompressed", caps: Capabilities{MaxBatchItems: 256, MaxBatchBytes: 8 << 20, MaxItemBytes: 1 << 20, ItemOverhead: 32, UncompressedPages: true}, compress: true, minFill: 0.95, minRowsPage: 30},
		{name: "records/uncompressed/small-item-limit", caps: Capabilities{MaxItemBytes: 3000, ItemOverhead: 32, UncompressedPages: true}, compress: true, minRowsPage: 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rows []Row
			for i := 0; i < 1500; i++ {
				v := recordValue(rng, i)
				if !tc.compress {
					for j := range v {
						v[j] = byte(rng.Uint32())
					}
				}
				target := Partition("tgt-a")
				if i%3 == 0 {
					target = "tgt-b"
				}
				rows = append(rows, Row{Target: target, Puts: []KV{{Key: fmt.Sprintf("user/%011d", i), Value: v}}})
			}
			const source = "src-bench"
			pages := planPages(source, 100, rows, tc.caps, tc.cfg)
			budget := tc.cfg.pageBytes(tc.caps)
			seq, next := uint64(100), map[Partition]int{}
			byTarget := map[Partition][]int{}
			for i, r := range rows {
				byTarget[r.Target] = append(byTarget[r.Target], i)
			}
			for i, pg := range pages {
				if pg.first != seq {
					t.Fatalf("page %d starts at seq %d, want %d", i, pg.first, seq)
				}
				seq += uint64(len(pg.rows))
				for _, ri := range pg.rows {
					if want := byTarget[pg.target][next[pg.target]]; ri != want {
						t.Fatalf("page %d holds row %d, want %d", i, ri, want)
					}
					next[pg.target]++
				}
				if tc.caps.UncompressedPages && pg.flags != 0 {
					t.Fatalf("page %d: flags %d on a store that takes pages uncompressed", i, pg.flags)
				}
				value := assemblePage(pg.first, 1_800_000_000_000, strings.Repeat("x", maxTagLen), pg.target, pg.flags, pg.body)
				size := tc.caps.ItemSize(source, layout.PageKey(pg.first), len(value))
				if size > budget || len(value) > pg.size {
					t.Fatalf("page %d: item size %d over budget %d, or value %d over its bound %d", i, size, budget, len(value), pg.size)
				}
				got, err := decodePage(layout.PageKey(pg.first), value)
				if err != nil || len(got.Rows) != len(pg.rows) {
					t.Fatalf("page %d does not decode: %v", i, err)
				}
				full := 0
				for _, ri := range pg.rows {
					full += rowEncodedLen(rows[ri])
				}
				if lim := tc.caps.MaxItemBytes; lim > 0 && tc.caps.ItemSize(source, layout.PageKey(pg.first), pageHeaderMax(strings.Repeat("x", maxTagLen), pg.target)+full) > lim {
					t.Fatalf("page %d: its rows with full keys exceed the item limit %d", i, lim)
				}
				last := next[pg.target] == len(byTarget[pg.target])
				if !last && (float64(size) < tc.minFill*float64(budget) || len(pg.rows) < tc.minRowsPage) {
					t.Fatalf("page %d: %d rows, item size %d of budget %d: filled below %.0f%% or %d rows", i, len(pg.rows), size, budget, 100*tc.minFill, tc.minRowsPage)
				}
			}
			if seq != 100+uint64(len(rows)) {
				t.Fatalf("pages hold %d rows, want %d", seq-100, len(rows))
			}
			t.Logf("%d rows in %d pages", len(rows), len(pages))
		})
	}
}

// A partly delivered page's rewrite never exceeds pageRewriteBound, which
// the fire reserves in its checkpoint batch.
func TestPageRewriteWithinBound(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 4))
	var c pageCodec
	for i := 0; i < 200; i++ {
		p := randomPage(rng)
		bound := pageRewriteBound(p)
		for k := 0; k < len(p.Rows); k++ {
			rest := p
			rest.Rows = p.Rows[k:]
			rest.First += uint64(k)
			if n := len(c.encode(rest)); n > bound {
				t.Fatalf("seed %d page %d: rewrite from row %d is %d bytes, bound %d", seed, i, k, n, bound)
			}
		}
	}
}

// Keys that share no prefix cost format 2 one varint more than format 1;
// the rewrite bound must still hold (seed 1795988269616696231 once broke it).
func TestPageRewriteBoundNoSharedPrefixes(t *testing.T) {
	var c pageCodec
	p := Page{First: 1 << 40, CommitMS: 1_800_000_000_000, Tag: "tag", Target: "t"}
	for i := 0; i < 64; i++ {
		p.Rows = append(p.Rows, Row{Deletes: []string{string(rune('a'+i%26)) + "k"}})
	}
	bound := pageRewriteBound(p)
	for k := range p.Rows {
		rest := p
		rest.Rows = p.Rows[k:]
		rest.First += uint64(k)
		if n := len(c.encode(rest)); n > bound {
			t.Fatalf("rewrite from row %d is %d bytes, bound %d", k, n, bound)
		}
	}
}
