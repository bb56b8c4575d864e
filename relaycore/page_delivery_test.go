package relaycore_test

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Compressed pages are delivered like any other, including when a fire
// delivers only part of a page and rewrites the rest (the Free budget
// delivers at most 2 target batches of 98 rows per target per fire, and a
// compressed page holds more).
func TestCompressedPagesPartlyDelivered(t *testing.T) {
	e := newEnv(t, "free")
	var rows []relaycore.Row
	for i := 0; i < 600; i++ {
		v := fmt.Sprintf(`{"id":%d,"name":"user %d","note":"%s"}`, i, i, strings.Repeat("lorem ipsum ", 12))
		rows = append(rows, put("t", fmt.Sprintf("user/%06d", i), v))
	}
	e.enqueue(rows...)
	v := e.inspect(e.source)
	if len(v.Pages) >= 600/60 {
		t.Fatalf("%d pages for 600 compressible rows: not compressed?", len(v.Pages))
	}
	drainRewriting(t, e, rows, pageDeflate)
}

// On a store with Capabilities.UncompressedPages no page is compressed,
// neither as enqueued nor as rewritten by a fire that delivered part of it,
// though the rows compress (the same rows are compressed on the default
// store), and every row is delivered.
func TestUncompressedPagesPartlyDelivered(t *testing.T) {
	var rows []relaycore.Row
	for i := 0; i < 900; i++ {
		rows = append(rows, put("t", fmt.Sprintf("user/%06d", i), fmt.Sprintf(`{"n":%d}`, i%7)))
	}
	// The default store compresses these rows.
	d := newEnv(t, "free")
	d.enqueue(rows...)
	for _, p := range d.inspect(d.source).Pages {
		if raw, _, _ := d.src.Get(d.ctx, d.source, p.Key); raw[1] != pageDeflate {
			t.Fatalf("default store: page %s flags %d; the rows no longer compress, so the test shows nothing", p.Key, raw[1])
		}
	}

	e := newEnv(t, "free")
	caps := mem.DefaultCapabilities
	caps.UncompressedPages = true
	e.src = mem.New(caps)
	e.srcF = &faultStore{Store: e.src}
	e.h.Source = e.srcF
	e.enqueue(rows...)
	v := e.inspect(e.source)
	if len(v.Pages) < 2 {
		t.Fatalf("%d pages; want several", len(v.Pages))
	}
	for _, p := range v.Pages {
		raw, _, _ := e.src.Get(e.ctx, e.source, p.Key)
		if raw[1] != 0 {
			t.Fatalf("page %s: flags %d, want uncompressed", p.Key, raw[1])
		}
		if caps.ItemSize(e.source, p.Key, len(raw)) > 8192 {
			t.Fatalf("page %s: %d bytes, over the default page budget", p.Key, len(raw))
		}
	}
	drainRewriting(t, e, rows, 0)
}

// pageDeflate is relaycore's flag of a compressed page body.
const pageDeflate = 1

// drainRewriting runs e's alarms until its source is drained, checking
// that at least one page was partly delivered and rewritten, every rewrite
// with the page flags want, and finally that every row reached its target.
func drainRewriting(t *testing.T, e *env, rows []relaycore.Row, want byte) {
	t.Helper()
	rewritten := false
	for alarms := 0; ; alarms++ {
		v := e.inspect(e.source)
		if v.Alarm == nil {
			break
		}
		if alarms > 50 {
			t.Fatal("not drained")
		}
		before := map[string]uint64{}
		for _, p := range v.Pages {
			before[p.Key] = p.First
		}
		e.clock.Set(timeMS(v.Alarm.DueMS))
		if _, err := e.h.Alarm(e.ctx, e.source); err != nil {
			t.Fatal(err)
		}
		for _, p := range e.inspect(e.source).Pages {
			if first, ok := before[p.Key]; ok && first != p.First {
				rewritten = true
				raw, _, _ := e.src.Get(e.ctx, e.source, p.Key)
				if raw[0] != 2 || raw[1] != want {
					t.Fatalf("rewritten page %s is format %d flags %d, want format 2 flags %d", p.Key, raw[0], raw[1], want)
				}
			}
		}
	}
	if !rewritten {
		t.Fatal("no page was partly delivered; the test no longer covers rewrites")
	}
	for i, r := range rows {
		if got, _ := e.target("t", r.Puts[0].Key); got != string(r.Puts[0].Value) {
			t.Fatalf("row %d: target holds %q", i, got)
		}
	}
}

// An outbox written by an engine before page format 2 (format-1 pages) is
// delivered by this one.
func TestFormat1OutboxDelivers(t *testing.T) {
	e := newEnv(t, "free")
	// Seqs 42..43 for target tenant-3: put user/1, user/2 (empty), delete
	// user/3; then delete user/1. Written by the format-1 encoder.
	page, _ := hex.DecodeString("012af6c1e285e3680e3966326334316430613762652e300874656e616e742d33020206757365722f31077b226e223a317d06757365722f32000106757365722f33000106757365722f31")
	if err := e.tgt.Apply(e.ctx, "tenant-3", relaycore.Batch{Writes: []relaycore.Write{{Key: "user/3", Value: []byte("old")}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{
		{Key: relaycore.KeyOS, Value: []byte(`{"next":44,"ver":5,"last_ms":1800000000123}`)},
		{Key: relaycore.KeyAlarm, Value: []byte(`{"due_ms":1800000000123}`), Due: 1800000000123},
		{Key: layout.PageKey(42), Value: page},
	}}); err != nil {
		t.Fatal(err)
	}
	e.drain(e.source, 10)
	if _, ok := e.target("tenant-3", "user/1"); ok {
		t.Fatal("user/1 was deleted by seq 43")
	}
	if _, ok := e.target("tenant-3", "user/3"); ok {
		t.Fatal("user/3 was deleted by seq 42")
	}
	if v, ok := e.target("tenant-3", "user/2"); !ok || v != "" {
		t.Fatalf("user/2 = %q, %v; want an empty value", v, ok)
	}
	if rh, _ := e.target("tenant-3", relaycore.RHKey(e.source)); rh != "43" {
		t.Fatalf("rh = %q, want 43", rh)
	}
}
