package relaycore_test

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Regression tests for defects found by the adversarial review of the
// engine (issue 2). Each failed before its fix.

// A target name is any byte string (infra/dynamo round-trips arbitrary
// bytes). rs used to keep the blocked set as plain JSON strings, which
// replace invalid UTF-8 with U+FFFD: the blocked target then looked healthy
// to the next fire, its later row was applied first and rh skipped the
// older row for good.
func TestReviewBlockedTargetNameSurvivesRS(t *testing.T) {
	for _, bad := range []relaycore.Partition{"t\xff", "t\xc3", "t<\"\\\x01>&\u2028"} {
		t.Run(string(bad), func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.Budget.TargetsPerFire = 1
			failing := true
			e.failTargets(string(bad), &failing)
			e.enqueue(put(bad, "k1", "old"))
			e.enqueue(put("good", "k", "v"))
			e.enqueue(put(bad, "k2", "new"))

			r := e.fire(e.source) // bad fails: blocked, cursor 1
			if r.TargetsBlocked != 1 {
				t.Fatalf("first fire %+v: want bad blocked", r)
			}
			v := e.inspect(e.source)
			checkBlockedInvariant(t, v)
			if len(v.RS.Blocked) != 1 || v.RS.Blocked[0] != bad {
				t.Fatalf("blocked = %q, want [%q]", v.RS.Blocked, bad)
			}
			failing = false
			e.drain(e.source, 20)
			if got, ok := e.target(bad, "k1"); !ok || got != "old" {
				t.Fatalf("older row of %q lost: k1 = %q, %v", bad, got, ok)
			}
			if got, _ := e.target(bad, "k2"); got != "new" {
				t.Fatalf("k2 = %q", got)
			}
		})
	}
}

// A target store with smaller limits than the enqueuer assumed (or a
// hostile stored page) can hold a row that fits no target batch. The fire
// used to index pending[-1] and panic; it must block that target only.
func TestReviewRowTooLargeForTargetBlocksNotPanics(t *testing.T) {
	e := newEnv(t, "free")
	e.tgt = mem.New(relaycore.Capabilities{MaxBatchItems: 3, MaxBatchBytes: 1 << 20, MaxItemBytes: 1 << 10, ItemOverhead: 32})
	e.tgtF = &faultStore{Store: e.tgt}
	e.h.Target = e.tgtF
	e.enqueue(put("wide", "a", "1", "b", "2", "c", "3"), put("ok", "k", "v"))
	var r relaycore.FireResult
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("fire panicked: %v", p)
			}
		}()
		r = e.fire(e.source)
	}()
	if r.TargetsBlocked != 1 {
		t.Fatalf("fire %+v: want the wide row's target blocked", r)
	}
	if v, _ := e.target("ok", "k"); v != "v" {
		t.Fatal("the healthy target was not delivered")
	}
	checkBlockedInvariant(t, e.inspect(e.source))
}

// A fire that starts over after an ambiguous checkpoint used to get a fresh
// budget each time, so one fire could make 3× TargetsPerFire×CallsPerTarget
// target calls and an alarm exceed its per-alarm call cap (Free: 32, below
// Cloudflare Free's 50 subrequests).
func TestReviewFireRetryKeepsTargetCallBudget(t *testing.T) {
	e := newEnv(t, "free")
	b := e.h.Budget
	var rows []relaycore.Row
	for i := 0; i < b.TargetsPerFire; i++ {
		rows = append(rows, put(relaycore.Partition("bad"+string(rune('a'+i))), "k", "v"))
	}
	e.enqueue(rows...)
	calls := 0
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" {
			calls++
			return errInjected
		}
		return nil
	}, nil)
	lost := 0
	e.srcF.set(func(c call) error {
		// The checkpoint: an rs write that releases the claim. Lose its
		// response twice, unapplied.
		if c.Op == "apply" && c.Key == relaycore.KeyRS && !bytes.Contains(c.Batch.Writes[0].Value, []byte(`"claim"`)) && lost < 2 {
			lost++
			return maybeApplied()
		}
		return nil
	}, nil)
	r, err := e.h.Fire(e.ctx, e.source)
	if err != nil {
		t.Fatalf("fire: %v", err)
	}
	if lost != 2 || r.Retries != 2 {
		t.Fatalf("lost %d checkpoints, %d retries: the test did not exercise the retry", lost, r.Retries)
	}
	if limit := b.TargetsPerFire * b.CallsPerTarget; calls > limit || r.TargetCalls > limit {
		t.Fatalf("one fire made %d target calls (reported %d), budget %d", calls, r.TargetCalls, limit)
	}
}

// hostilePage is a format-2 page whose rows each put a MaxKeyLen-byte key
// stored as "shares all but one byte with the previous key": a few bytes of
// input per key, MaxKeyLen bytes of decoded key.
func hostilePage(rows int) []byte {
	var sec []byte
	sec = binary.AppendUvarint(sec, uint64(rows))
	key := bytes.Repeat([]byte("k"), relaycore.MaxKeyLen)
	for i := 0; i < rows; i++ {
		sec = binary.AppendUvarint(sec, 1) // one put
		if i == 0 {
			sec = binary.AppendUvarint(sec, 0)
			sec = binary.AppendUvarint(sec, uint64(len(key)))
			sec = append(sec, key...)
		} else {
			// Share all but the last byte, which alternates, so every key
			// is a distinct MaxKeyLen-byte string.
			sec = binary.AppendUvarint(sec, uint64(len(key)-1))
			sec = binary.AppendUvarint(sec, 1)
			sec = append(sec, "ab"[i%2])
		}
		sec = binary.AppendUvarint(sec, 0) // empty value
		sec = binary.AppendUvarint(sec, 0) // no deletes
	}
	var z bytes.Buffer
	zw, _ := flate.NewWriter(&z, flate.BestCompression)
	_, _ = zw.Write(sec)
	_ = zw.Close()
	page := []byte{2, 1}
	page = binary.AppendUvarint(page, 1) // first seq
	page = binary.AppendVarint(page, 0)  // commit ms
	page = binary.AppendUvarint(page, 0) // tag
	page = binary.AppendUvarint(page, 1) // target
	page = append(page, 't')             //
	page = binary.AppendUvarint(page, uint64(len(sec)))
	return append(page, z.Bytes()...)
}

// DecodePage promises to bound what it allocates by the page's size (a
// compressed section by maxPageRawBytes). Shared key prefixes used to let a
// small stored page expand into gigabytes of keys.
func TestReviewDecodePageBoundsKeyExpansion(t *testing.T) {
	raw := hostilePage(30000) // ~30 MB of keys from a page of a few hundred bytes
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, err := relaycore.DecodePage(layout.PageKey(1), raw)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("stored page %d bytes, decode allocated %d bytes, err %v", len(raw), alloc, err)
	if err == nil {
		t.Fatalf("decoded %d rows of %d-byte keys from a %d-byte page", len(p.Rows), relaycore.MaxKeyLen, len(raw))
	}
	if !errors.Is(err, relaycore.ErrCorruptRecord) {
		t.Fatalf("err = %v, want ErrCorruptRecord", err)
	}
	if alloc > 16<<20 {
		t.Fatalf("decoding a %d-byte page allocated %d bytes", len(raw), alloc)
	}
}

// The checkpoint reserves room for rs assuming each blocked name takes at
// most its length in JSON, but encoding/json writes a control byte or <, >
// and & as six bytes. With 32 such names blocked, a fire that collects pages
// up to that reservation built a checkpoint over the store's batch limit,
// which fails (surely not applied) on every fire: the source was stuck.
func TestReviewCheckpointReservesBlockedNames(t *testing.T) {
	e := newEnv(t, "free")
	e.src = mem.New(relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: 52 << 10, MaxItemBytes: 400 << 10, ItemOverhead: 32})
	e.srcF = &faultStore{Store: e.src}
	e.h.Source = e.srcF
	e.h.Budget.RowsPerFire = 9 // the second page of good is rewritten
	failing := true
	e.failTargets("\x01", &failing)
	var rows []relaycore.Row
	for i := 0; i < relaycore.MaxBlockedTargets; i++ {
		name := string(bytes.Repeat([]byte{1}, relaycore.MaxPartitionLen-1)) + string(rune('A'+i))
		rows = append(rows, put(relaycore.Partition(name), "k", "v"))
	}
	e.enqueue(rows...)
	rows = rows[:0]
	for i := 0; i < 48; i++ {
		// Incompressible 1 KB values: pages stay near their full size.
		v := make([]byte, 1000)
		for j := range v {
			v[j] = byte((i*7919 + j*j*31 + j>>3) % 251)
		}
		rows = append(rows, relaycore.Row{Target: "good", Puts: []relaycore.KV{{Key: string(rune('a'+i%26)) + string(rune('a'+i/26)), Value: v}}})
	}
	e.enqueue(rows...)
	for f := 0; f < 8; f++ {
		if _, err := e.h.Fire(e.ctx, e.source); err != nil {
			t.Fatalf("fire %d: %v", f, err)
		}
		checkBlockedInvariant(t, e.inspect(e.source))
	}
	if _, ok := e.target("good", "bb"); !ok {
		t.Fatal("the healthy target behind 32 blocked targets was not delivered")
	}
}

// The encoder must never write a page its own decoder refuses: on a store
// with a large item limit, rows of long keys that share their prefixes
// compress into one small page whose keys sum past maxPageKeyBytes.
func TestReviewPagesStayDecodable(t *testing.T) {
	e := newEnv(t, "free")
	e.src = mem.New(relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: 64 << 20, MaxItemBytes: 32 << 20, ItemOverhead: 32})
	prefix := string(bytes.Repeat([]byte("k"), relaycore.MaxKeyLen-8))
	var rows []relaycore.Row
	for i := 0; i < 6000; i++ {
		rows = append(rows, put("t", prefix+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)), "v"))
	}
	e.enqueue(rows...)
	v, err := relaycore.InspectSource(e.ctx, e.src, e.source)
	if err != nil {
		t.Fatalf("enqueue wrote a page the decoder refuses: %v", err)
	}
	if n := len(v.Rows()); n != len(rows) {
		t.Fatalf("%d rows in the outbox, want %d", n, len(rows))
	}
}

// FuzzRelayStateBlockedNames: any target name survives rs byte for byte,
// and a full blocked set of such names keeps rs within the size the
// checkpoint reserves for it (rsMaxBytes, checked in package tests).
func FuzzRelayStateBlockedNames(f *testing.F) {
	for _, s := range []string{"tenant-3", "t\xff", "\x00", "\x00AAA", "<&>", "\u2028", "\"\\", "é", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if len(name) > relaycore.MaxPartitionLen {
			name = name[:relaycore.MaxPartitionLen]
		}
		rs := relaycore.RelayState{Version: 1, CycleEnd: 9, Cursor: 3, Blocked: []relaycore.Partition{relaycore.Partition(name), "x"}}
		raw, err := json.Marshal(rs)
		if err != nil {
			t.Fatal(err)
		}
		var back relaycore.RelayState
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if len(back.Blocked) != 2 || back.Blocked[0] != relaycore.Partition(name) || back.Blocked[1] != "x" {
			t.Fatalf("blocked %q came back as %q (stored %s)", name, back.Blocked, raw)
		}
	})
}

// A fire that starts over continues with the inspect budget its first
// attempt left; when that is spent the retry collects nothing, but the
// first attempt's deliveries still count as progress (no back-off). They
// are reported delivered by the fire that records them (cleans them), once.
func TestReviewFireRetryCreditsEarlierDeliveries(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Budget.RowsPerFire = 1 // inspects at most 4 rows
	failing := true
	e.failTargets("bad", &failing)
	e.enqueue(put("bad", "a", "1"), put("bad", "b", "1"), put("bad", "c", "1"), put("bad", "d", "1"))
	e.enqueue(put("good", "k", "v"))
	if r := e.fire(e.source); r.TargetsBlocked != 1 || r.Cursor != 1 {
		t.Fatalf("first fire %+v: want bad blocked at cursor 1", r)
	}
	lost := false
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && c.Key == relaycore.KeyRS && !bytes.Contains(c.Batch.Writes[0].Value, []byte(`"claim"`)) && !lost {
			lost = true
			return maybeApplied()
		}
		return nil
	}, nil)
	r := e.fire(e.source)
	if r.Retries != 1 || r.RowsDelivered != 0 || r.TargetCalls != 1 {
		t.Fatalf("fire %+v: want good applied, then one retry that records nothing", r)
	}
	if r.RowsInspected > 4*e.h.Budget.RowsPerFire {
		t.Fatalf("fire inspected %d rows, limit %d", r.RowsInspected, 4*e.h.Budget.RowsPerFire)
	}
	if !r.Progress || r.NextDueMS != e.clock.Now().UnixMilli() {
		t.Fatalf("fire %+v delivered a row but reports no progress", r)
	}
	if v, _ := e.target("good", "k"); v != "v" {
		t.Fatal("good not delivered")
	}
	failing = false
	_, total := e.drain(e.source, 50)
	if v, _ := e.target("bad", "d"); v != "1" {
		t.Fatal("bad not delivered after recovery")
	}
	if total.RowsDelivered != 5 {
		t.Fatalf("the drain reported %d rows delivered, want good's and bad's 4", total.RowsDelivered)
	}
}

// A page must fit a checkpoint beside rs, or no fire can ever collect it
// (the checkpoint may have to rewrite it) and the source is stuck for good.
// With an item limit close to the batch limit, enqueue used to accept a row
// whose page could never be delivered; it must refuse it, or deliver it.
func TestReviewEveryAcceptedPageFitsACheckpoint(t *testing.T) {
	e := newEnv(t, "free")
	caps := relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: 64 << 10, MaxItemBytes: 64 << 10, ItemOverhead: 32}
	e.src = mem.New(caps)
	e.srcF = &faultStore{Store: e.src}
	e.h.Source = e.srcF
	noise := func(n, seed int) []byte {
		v := make([]byte, n)
		x := uint32(seed)*2654435761 + 1 // the same bits as int math on 64-bit, and it compiles on 32-bit
		for i := range v {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			v[i] = byte(x)
		}
		return v
	}
	for _, size := range []int{56 << 10, 10 << 10} {
		var rows []relaycore.Row
		for i := 0; i < 6; i++ {
			rows = append(rows, relaycore.Row{Target: "t", Puts: []relaycore.KV{{Key: string(rune('a' + i)), Value: noise(size, size+i)}}})
		}
		// Pages of several rows are bounded by the same rule.
		_, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, rows, relaycore.EnqueueConfig{PageBytes: 64 << 10})
		if err != nil {
			if !errors.Is(err, relaycore.ErrInvalidRow) {
				t.Fatalf("enqueue %d-byte rows: %v", size, err)
			}
			t.Logf("enqueue refused %d-byte rows: %v", size, err)
			continue
		}
		e.drain(e.source, 40)
		if _, ok := e.target("t", "f"); !ok {
			t.Fatalf("%d-byte rows not delivered", size)
		}
	}
}

// Budget products saturate: a huge configured budget means "unbounded",
// never a negative (wrapped) one that stops delivery.
func TestReviewHugeBudgetDoesNotWrap(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Budget = relaycore.RelayBudget{FiresPerAlarm: 2, TargetsPerFire: math.MaxInt / 2, CallsPerTarget: 4, RowsPerFire: math.MaxInt/4 + 1}
	if got := e.h.Budget.TargetCallsPerAlarm(); got <= 0 {
		t.Fatalf("TargetCallsPerAlarm = %d", got)
	}
	e.enqueue(put("t", "k", "v"))
	if r := e.fire(e.source); r.RowsDelivered != 1 {
		t.Fatalf("fire %+v: want the row delivered", r)
	}
}

// skewedClock reads a base clock through a fixed offset (a writer whose
// clock is wrong).
type skewedClock struct {
	base   relaycore.Clock
	offset time.Duration
}

func (c skewedClock) Now() time.Time { return c.base.Now().Add(c.offset) }

// Commit times are monotonic per source (max(now, os.last_ms)), and the
// durable alarm used to be due at the commit time: one enqueue by a writer
// whose clock ran a day ahead pushed every later enqueue's wake-up a day
// into the future, where the sweeper (which fires overdue alarms) does not
// look, and it postponed the pending wake-up of rows committed before it.
// The alarm is due at the enqueuer's own clock, and an enqueue never moves
// an alarm that is already due later.
func TestReviewSkewedWriterDoesNotPostponeWakeUps(t *testing.T) {
	ahead := skewedClock{offset: 24 * time.Hour}
	commit := func(t *testing.T, e *env, clock relaycore.Clock, row relaycore.Row) relaycore.CommitResult {
		t.Helper()
		res, err := relaycore.CommitRelayRows(e.ctx, e.src, clock, e.source, nil, time.Time{}, []relaycore.Row{row}, relaycore.EnqueueConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	overdue := func(t *testing.T, e *env, what string) {
		t.Helper()
		if a := e.inspect(e.source).Alarm; a == nil || a.DueMS > e.clock.Now().UnixMilli() {
			t.Fatalf("%s: alarm %+v not due by now %d: a sweeper would not fire it", what, a, e.clock.Now().UnixMilli())
		}
	}
	t.Run("correct writer after a skewed one", func(t *testing.T) {
		e := newEnv(t, "free")
		ahead.base = e.clock
		commit(t, e, ahead, put("t", "a", "1"))
		res := commit(t, e, e.clock, put("t", "b", "1"))
		overdue(t, e, "after the correct writer's enqueue")
		if res.AlarmDueMS > e.clock.Now().UnixMilli() {
			t.Fatalf("kicked at %d, after now", res.AlarmDueMS)
		}
	})
	t.Run("skewed writer after a correct one", func(t *testing.T) {
		e := newEnv(t, "free")
		ahead.base = e.clock
		commit(t, e, e.clock, put("t", "a", "1"))
		commit(t, e, ahead, put("t", "b", "1"))
		overdue(t, e, "after the skewed writer's enqueue")
		ar, err := e.h.Alarm(e.ctx, e.source)
		if err != nil || ar.RowsDelivered != 2 {
			t.Fatalf("alarm %+v, %v: want both rows delivered", ar, err)
		}
	})
}

// A lease holder name that JSON cannot keep byte for byte (invalid UTF-8)
// was stored altered, so the fresh lease AcquireLease returned never matched
// its own record and every enqueue with it failed as stale. AcquireLease
// refuses such a name up front.
func TestReviewLeaseHolderRoundTrips(t *testing.T) {
	e := newEnv(t, "free")
	l, err := relaycore.AcquireLease(e.ctx, e.src, e.source, "writer-\xff", time.Minute, e.clock.Now())
	if err != nil {
		return // refused up front: fine
	}
	if _, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, &l, time.Time{}, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueConfig{}); err != nil {
		t.Fatalf("enqueue with the lease just acquired: %v", err)
	}
}

// Seqs are never reused: an os whose next seq leaves no room for the rows
// (corrupt or hostile) must fail closed instead of wrapping to small seqs
// that earlier rows already took.
func TestReviewSeqOverflowFailsClosed(t *testing.T) {
	e := newEnv(t, "free")
	os := []byte(`{"next":18446744073709551615,"ver":1,"last_ms":0}`)
	if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyOS, Value: os}}}); err != nil {
		t.Fatal(err)
	}
	_, err := relaycore.CommitRelayRows(e.ctx, e.src, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("t", "a", "1"), put("t", "b", "2")}, relaycore.EnqueueConfig{})
	if !errors.Is(err, relaycore.ErrCorruptRecord) {
		t.Fatalf("enqueue past the last seq: err = %v, want ErrCorruptRecord", err)
	}
	if v, _, _ := e.src.Get(e.ctx, e.source, relaycore.KeyOS); !bytes.Equal(v, os) {
		t.Fatalf("os rewritten to %s", v)
	}
}

// rawPage encodes a one-row format-2 page by hand (what a corrupt or hostile
// store could hold).
func rawPage(first uint64, target, key, value string) []byte {
	b := []byte{2, 0}
	b = binary.AppendUvarint(b, first)
	b = binary.AppendVarint(b, 0)
	b = binary.AppendUvarint(b, 0) // tag
	b = binary.AppendUvarint(b, uint64(len(target)))
	b = append(b, target...)
	b = binary.AppendUvarint(b, 1) // rows
	b = binary.AppendUvarint(b, 1) // puts
	b = binary.AppendUvarint(b, 0) // shared
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, uint64(len(value)))
	b = append(b, value...)
	return binary.AppendUvarint(b, 0) // deletes
}

// A page whose rows lie beyond the cycle (or out of seq order) cannot be
// written by the engine: a page with a key at or below cycle_end came from
// a batch that committed before the cycle started. Delivering such a row
// moved rh past seqs not yet committed, so those rows, when they came, were
// skipped as already applied. The fire must fail closed instead.
func TestReviewFireRefusesPagesBeyondTheCycle(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "a", "1"))
	e.enqueue(put("t", "b", "2"))
	// The first page is replaced by one claiming seq 100.
	if err := e.src.Apply(e.ctx, e.source, relaycore.Batch{Writes: []relaycore.Write{{Key: layout.PageKey(1), Value: rawPage(100, "t", "x", "hostile")}}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.h.Fire(e.ctx, e.source)
	if !errors.Is(err, relaycore.ErrCorruptRecord) {
		t.Fatalf("fire over a page beyond the cycle: err = %v, want ErrCorruptRecord", err)
	}
	if rh, _ := relaycore.TargetWatermark(e.ctx, e.tgt, "t", e.source); rh > 2 {
		t.Fatalf("rh(t) = %d: beyond the last committed seq 2", rh)
	}
}
