package takedowns_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Reports of one node apply in the order it sent them, under its
// idempotency key: the same key and reports again write nothing, the same
// key with other reports is refused.
func TestReports(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.nodes["edge-a"] = true
		now := e.clock.Now()
		held := takedowns.Report{ContentID: "seg-1", SHA256: digestOf("seg-1"), Size: 7, State: "held", ObservedMS: now.UnixMilli()}
		evicted := held
		evicted.State, evicted.ObservedMS = "evicted", held.ObservedMS+1
		r, err := e.o.Report(e.ctx, "edge-a", "batch/1", []takedowns.Report{held, evicted})
		if err != nil || r.Accepted != 2 || r.Replayed {
			t.Fatalf("report: %+v %v", r, err)
		}
		before := e.src.applies.Load()
		r, err = e.o.Report(e.ctx, "edge-a", "batch/1", []takedowns.Report{held, evicted})
		if err != nil || !r.Replayed {
			t.Fatalf("replay: %+v %v", r, err)
		}
		if _, err := e.o.Report(e.ctx, "edge-a", "batch/1", []takedowns.Report{held}); !errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
			t.Fatalf("key reused with other reports: %v", err)
		}
		if n := e.src.applies.Load() - before; n != 0 {
			t.Fatalf("the replay and the refusal applied %d batches", n)
		}
		e.clock.add(time.Second)
		e.deliver()
		hs, err := e.o.Holders(e.ctx, "seg-1")
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 1 || hs[0].Node != "edge-a" || hs[0].State != "evicted" || hs[0].ObservedMS != evicted.ObservedMS ||
			hs[0].ReportedMS != now.UnixMilli() || hs[0].SHA256 != held.SHA256 {
			t.Fatalf("holders: %+v", hs)
		}
		for i, bad := range []takedowns.Report{
			{ContentID: ".x", SHA256: held.SHA256, State: "held", ObservedMS: 1},
			{ContentID: "x", SHA256: strings.ToUpper(held.SHA256), State: "held", ObservedMS: 1},
			{ContentID: "x", SHA256: held.SHA256, State: "gone", ObservedMS: 1},
			{ContentID: "x", SHA256: held.SHA256, State: "held", ObservedMS: 0},
			{ContentID: "x", SHA256: held.SHA256, State: "held", ObservedMS: 1, Size: -1},
		} {
			if _, err := e.o.Report(e.ctx, "edge-a", fmt.Sprintf("bad/%d", i), []takedowns.Report{bad}); !errors.Is(err, takedowns.ErrInvalid) {
				t.Errorf("bad report %d: %v", i, err)
			}
		}
	})
}

// 500 reports of distinct contents, the most one request carries, commit
// as one idempotent batch on DynamoDB's 100 items per transaction (one row
// page per holder shard, not per content).
func TestReportBatchFits(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		var rs []takedowns.Report
		for i := range takedowns.MaxReports {
			c := fmt.Sprintf("seg-%03d-%s", i, strings.Repeat("x", 118))
			rs = append(rs, takedowns.Report{ContentID: c, SHA256: digestOf(c), Size: 1 << 20, State: "held", ObservedMS: 1800000000123})
		}
		node := strings.Repeat("n", 64)
		if _, err := e.o.Report(e.ctx, node, "full", rs); err != nil {
			t.Fatal(err)
		}
	})
}

// The whole flow: holders a and b, a request, orders to each, signed
// receipts, complete only after the last receipt; the receipt file verifies
// offline with the CA only.
func TestTakedownFlow(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		t0 := e.clock.Now()
		e.report("edge-a", "seg-9f2c", "held", t0)
		e.report("edge-b", "seg-9f2c", "held", t0)
		e.report("edge-c", "seg-other", "held", t0)
		e.deliver()
		e.clock.add(time.Second)
		op, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-1", takedowns.RequestOptions{})
		td, nodes := op.Takedown, op.Holders
		if err != nil || strings.Join(nodes, ",") != "edge-a,edge-b" {
			t.Fatalf("request: %v %v", nodes, err)
		}
		if _, err := e.o.Status(e.ctx, td.ID); !errors.Is(err, takedowns.ErrNotYet) {
			t.Fatalf("status before delivery: %v", err)
		}
		if _, err := e.o.Status(e.ctx, "1796180302096-88204ce0"); !errors.Is(err, takedowns.ErrNotFound) {
			t.Fatalf("status of an unknown takedown: %v", err)
		}
		e.deliver()
		st := e.status(td.ID)
		if st.Complete || st.HoldersExpected != 2 || st.Pending != 2 || st.RequestedBy != "operator-1" {
			t.Fatalf("status before the orders: %+v", st)
		}
		if r := e.run(); r.Ordered != 2 || r.Open != 1 {
			t.Fatalf("run: %+v", r)
		}
		if r := e.run(); r.Ordered != 0 || r.Waiting != 1 {
			t.Fatalf("second run before delivery: %+v", r)
		}
		e.deliver()
		if r := e.run(); r.Ordered != 0 || r.LateRequests != 0 || r.Pending != 2 {
			t.Fatalf("run after delivery: %+v", r)
		}
		if o := e.orders("edge-c"); len(o) != 0 {
			t.Fatalf("edge-c was ordered: %+v", o)
		}
		lines := map[string][]byte{}
		for _, n := range []string{"edge-a", "edge-b"} {
			os := e.orders(n)
			want := fmt.Sprintf("seg-9f2c/%s/%019d", n, td.RequestedMS)
			if len(os) != 1 || os[0].Request != want || os[0].SHA256 != digestOf("seg-9f2c") || os[0].Takedown != td.ID ||
				os[0].Reason != "dmca 2026-118" || len(os[0].Cursor) != 20 {
				t.Fatalf("orders of %s: %+v", n, os)
			}
			lines[n] = e.evict(e.pki, n, os[0], e.clock.Now())
		}
		r, err := e.o.Receipt(e.ctx, "edge-a", lines["edge-a"])
		if err != nil || r.Replayed || r.Takedown != td.ID {
			t.Fatalf("receipt: %+v %v", r, err)
		}
		if r, err := e.o.Receipt(e.ctx, "edge-a", append(lines["edge-a"], '\n')); err != nil || !r.Replayed {
			t.Fatalf("the same receipt again, before delivery: %+v %v", r, err)
		}
		e.deliver()
		if r, err := e.o.Receipt(e.ctx, "edge-a", lines["edge-a"]); err != nil || !r.Replayed {
			t.Fatalf("the same receipt again: %+v %v", r, err)
		}
		st = e.status(td.ID)
		if st.Complete || st.ReceiptsVerified != 1 || st.Pending != 1 || st.Holders[1].State != "pending" || st.Holders[1].LastReportMS != t0.UnixMilli() {
			t.Fatalf("status with one receipt: %+v", st)
		}
		if _, err := e.o.Receipt(e.ctx, "edge-b", lines["edge-b"]); err != nil {
			t.Fatal(err)
		}
		if st := e.status(td.ID); st.Complete {
			t.Fatalf("complete before the receipt was delivered: %+v", st)
		}
		e.deliver()
		st = e.status(td.ID)
		if !st.Complete || st.ReceiptsVerified != 2 || st.Pending != 0 {
			t.Fatalf("status with both receipts: %+v", st)
		}
		file, err := e.o.Receipts(e.ctx, td.ID)
		if err != nil {
			t.Fatal(err)
		}
		res, err := takedown.VerifyAll(bytes.NewReader(file), caPool(t, e.pki), e.clock.Now())
		if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
			t.Fatalf("receipt file: %+v %v", res, err)
		}
	})
}

// accepted sets up takedown of seg-9f2c held by edge-a and edge-b, ordered
// and delivered, and returns it with edge-b's order.
func (e *env) ordered() (takedowns.Takedown, takedowns.Order) {
	e.t.Helper()
	t0 := e.clock.Now()
	e.report("edge-a", "seg-9f2c", "held", t0)
	e.report("edge-b", "seg-9f2c", "held", t0)
	e.deliver()
	op, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-1", takedowns.RequestOptions{})
	td := op.Takedown
	if err != nil {
		e.t.Fatal(err)
	}
	e.deliver()
	e.run()
	e.deliver()
	os := e.orders("edge-b")
	if len(os) != 1 {
		e.t.Fatalf("orders: %+v", os)
	}
	return td, os[0]
}

// Hostile receipts are refused and change nothing: forged (another key,
// another CA, another node's certificate), another node's receipt, a
// request never ordered to that node, a digest the index did not have,
// dated before the request, a second receipt for an answered request.
func TestHostileReceipts(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		td, ord := e.ordered()
		other := pkitestNew(t, "edge-b")
		good := e.evict(e.pki, "edge-b", ord, e.clock.Now())
		aLine := e.evict(e.pki, "edge-a", e.orders("edge-a")[0], e.clock.Now())

		swap := func(line []byte, field string, from []byte) []byte {
			var m, f map[string]any
			json.Unmarshal(line, &m)
			json.Unmarshal(from, &f)
			m[field] = f[field]
			out, _ := json.Marshal(struct {
				V         int    `json:"v"`
				Receipt   string `json:"receipt"`
				Signature string `json:"signature"`
				Chain     []any  `json:"chain"`
			}{1, m["receipt"].(string), m["signature"].(string), m["chain"].([]any)})
			return out
		}
		// edge-a's signature over its own receipt, put on edge-b's receipt.
		wrongKey := swap(good, "signature", aLine)
		// edge-b's receipt with edge-a's certificate chain.
		otherNodesCert := swap(good, "chain", aLine)
		otherCA := e.evict(other, "edge-b", ord, e.clock.Now())
		changed := ord
		changed.SHA256 = strings.Repeat("cd", 32)
		wrongDigest := e.evict(e.pki, "edge-b", changed, e.clock.Now())
		changed = ord
		changed.Request = "seg-9f2c/edge-b/0000000000000000001"
		notOrdered := e.evict(e.pki, "edge-b", changed, e.clock.Now())
		changed = ord
		changed.ContentID = "seg-other"
		otherContent := e.evict(e.pki, "edge-b", changed, e.clock.Now())
		early := e.evict(e.pki, "edge-b", ord, time.UnixMilli(ord.RequestedMS).Add(-takedown.MaxClockSkew-time.Second))
		resigned := e.evict(e.pki, "edge-b", ord, e.clock.Now().Add(time.Second))

		cases := []struct {
			name, node string
			line       []byte
			why        string
		}{
			{"wrong key", "edge-b", wrongKey, "signature does not verify"},
			{"other CA", "edge-b", otherCA, "not issued by a trusted CA"},
			{"other node's certificate", "edge-b", otherNodesCert, "another node's"},
			{"another node's receipt", "edge-a", good, "caller is \"edge-a\""},
			{"digest never held", "edge-b", wrongDigest, "not the one the holder index had"},
			{"not ordered", "edge-b", notOrdered, "no order for request"},
			{"other content", "edge-b", otherContent, "not the order's"},
			{"dated before the request", "edge-b", early, "before the request"},
			{"malformed", "edge-b", append([]byte(" "), good...), "malformed"},
		}
		check := func(name, node string, line []byte, why string) {
			t.Helper()
			s0, d0 := e.src.applies.Load(), e.dst.applies.Load()
			_, err := e.o.Receipt(e.ctx, node, line)
			if !errors.Is(err, takedowns.ErrRefused) || !strings.Contains(err.Error(), why) {
				t.Errorf("%s: %v, want refused: %s", name, err, why)
			}
			if s, d := e.src.applies.Load()-s0, e.dst.applies.Load()-d0; s+d != 0 {
				t.Errorf("%s: refused, yet %d+%d batches applied", name, s, d)
			}
		}
		for _, c := range cases {
			check(c.name, c.node, c.line, c.why)
		}
		e.deliver()
		if st := e.status(td.ID); st.ReceiptsVerified != 0 || st.Complete {
			t.Fatalf("after hostile receipts: %+v", st)
		}
		if _, err := e.o.Receipt(e.ctx, "edge-b", good); err != nil {
			t.Fatal(err)
		}
		e.deliver()
		check("another receipt for an answered request", "edge-b", resigned, "accepted already")
		if st := e.status(td.ID); st.ReceiptsVerified != 1 || st.Holders[1].State != "evicted" {
			t.Fatalf("status: %+v", st)
		}
	})
}

// A late holder (edge-c reports the content after the request) gets its
// own request and order; the takedown is not complete until it answers. A
// holder whose content comes back after its receipt (a rebuilt edged.db)
// is requested again.
func TestLateHolder(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		td, ord := e.ordered()
		for _, n := range []string{"edge-a", "edge-b"} {
			o := ord
			if n == "edge-a" {
				o = e.orders("edge-a")[0]
			}
			if _, err := e.o.Receipt(e.ctx, n, e.evict(e.pki, n, o, e.clock.Now())); err != nil {
				t.Fatal(err)
			}
		}
		e.deliver()
		if st := e.status(td.ID); !st.Complete {
			t.Fatalf("not complete: %+v", st)
		}
		e.clock.add(time.Minute)
		e.report("edge-c", "seg-9f2c", "held", e.clock.Now())
		e.deliver()
		st := e.status(td.ID)
		if st.Complete || st.HoldersExpected != 3 || st.Holders[2].State != "unrequested" {
			t.Fatalf("with a late holder: %+v", st)
		}
		if r := e.run(); r.LateRequests != 1 {
			t.Fatalf("run: %+v", r)
		}
		e.deliver()
		if r := e.run(); r.Ordered != 1 || r.LateRequests != 0 {
			t.Fatalf("run: %+v", r)
		}
		e.deliver()
		os := e.orders("edge-c")
		if len(os) != 1 || os[0].RequestedMS != e.clock.Now().UnixMilli() {
			t.Fatalf("edge-c's orders: %+v", os)
		}
		if _, err := e.o.Receipt(e.ctx, "edge-c", e.evict(e.pki, "edge-c", os[0], e.clock.Now())); err != nil {
			t.Fatal(err)
		}
		e.deliver()
		if st := e.status(td.ID); !st.Complete || st.ReceiptsVerified != 3 {
			t.Fatalf("after edge-c's receipt: %+v", st)
		}
		// edge-b holds it again (observed after its eviction): requested anew.
		e.clock.add(time.Minute)
		e.report("edge-b", "seg-9f2c", "held", e.clock.Now())
		e.deliver()
		if st := e.status(td.ID); st.Complete || st.Holders[1].State != "unrequested" {
			t.Fatalf("edge-b holds it again, before the owner's pass: %+v", st)
		}
		if r := e.run(); r.LateRequests != 1 {
			t.Fatalf("run: %+v", r)
		}
		e.deliver()
		e.run()
		e.deliver()
		if os := e.orders("edge-b"); len(os) != 2 || os[1].Cursor <= os[0].Cursor {
			t.Fatalf("edge-b's orders: %+v", os)
		}
		if st := e.status(td.ID); st.Complete || st.Holders[1].State != "pending" || st.Holders[1].Requests != 2 {
			t.Fatalf("status: %+v", st)
		}
	})
}

// A holder past its handoff's timer is overdue, counted by every pass and
// never dropped; a waiver (audited) completes the takedown without it.
func TestOverdueAndWaive(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		td, ord := e.ordered()
		if _, err := e.o.Receipt(e.ctx, "edge-b", e.evict(e.pki, "edge-b", ord, e.clock.Now())); err != nil {
			t.Fatal(err)
		}
		e.deliver()
		if r := e.run(); r.Overdue != 0 || r.Pending != 1 {
			t.Fatalf("run: %+v", r)
		}
		e.clock.add(overdue)
		for range 2 {
			if r := e.run(); r.Overdue != 1 || r.Pending != 1 || r.Complete != 0 {
				t.Fatalf("run past the timer: %+v", r)
			}
		}
		st := e.status(td.ID)
		if st.Overdue != 1 || !st.Holders[0].Overdue || st.Holders[0].Node != "edge-a" {
			t.Fatalf("status: %+v", st)
		}
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-c", "never held it", "operator-2"); !errors.Is(err, takedowns.ErrNotHolder) {
			t.Fatalf("waive a non-holder: %v", err)
		}
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "device destroyed, ticket 4411", "operator-2"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "again", "operator-2"); !errors.Is(err, takedowns.ErrWaived) {
			t.Fatalf("waive twice: %v", err)
		}
		e.deliver()
		st = e.status(td.ID)
		if !st.Complete || st.Waived != 1 || st.Holders[0].Waiver == nil || st.Holders[0].Waiver.By != "operator-2" ||
			st.Holders[0].Waiver.Reason != "device destroyed, ticket 4411" {
			t.Fatalf("status after the waiver: %+v", st)
		}
	})
}

// A waiver releases the copy the operator knew of: a waived holder that
// reports holding the content again is a late holder (the takedown is
// incomplete until it proves its eviction, or is waived anew, the renewal
// keeping the earlier waiver), and a receipt arriving after a waiver is
// recorded and counts as proof.
func TestWaivedHolderReportsAgain(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		td, ordB := e.ordered()
		if _, err := e.o.Receipt(e.ctx, "edge-b", e.evict(e.pki, "edge-b", ordB, e.clock.Now())); err != nil {
			t.Fatal(err)
		}
		ordA := e.orders("edge-a")[0]
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "device destroyed, ticket 4411", "operator-2"); err != nil {
			t.Fatal(err)
		}
		e.deliver()
		if st := e.status(td.ID); !st.Complete || st.Waived != 1 {
			t.Fatalf("after the waiver: %+v", st)
		}
		e.clock.add(time.Second)
		e.report("edge-a", "seg-9f2c", "held", e.clock.Now()) // not destroyed after all
		e.deliver()
		if r := e.run(); r.LateRequests != 0 || r.Complete != 0 {
			t.Fatalf("run: %+v (edge-a's order stands: no second request)", r)
		}
		st := e.status(td.ID)
		if st.Complete || st.Holders[0].State != takedowns.HolderPending || st.Holders[0].Waiver == nil {
			t.Fatalf("a waived holder reported the content again: %+v", st)
		}
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "gone again, ticket 4412", "operator-3"); err != nil {
			t.Fatalf("renew the waiver: %v", err)
		}
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "again", "operator-3"); !errors.Is(err, takedowns.ErrWaived) {
			t.Fatalf("waive a covered holder: %v", err)
		}
		e.deliver()
		st = e.status(td.ID)
		if w := st.Holders[0].Waiver; !st.Complete || w == nil || w.By != "operator-3" || len(w.Earlier) != 1 || w.Earlier[0].By != "operator-2" ||
			w.Earlier[0].Reason != "device destroyed, ticket 4411" || w.ReportSeq <= w.Earlier[0].ReportSeq {
			t.Fatalf("after the renewal: %+v", st)
		}
		// edge-a answers its order after all: the receipt is recorded.
		e.clock.add(time.Second)
		if _, err := e.o.Receipt(e.ctx, "edge-a", e.evict(e.pki, "edge-a", ordA, e.clock.Now())); err != nil {
			t.Fatalf("a waived holder's receipt: %v", err)
		}
		e.deliver()
		st = e.status(td.ID)
		if !st.Complete || st.ReceiptsVerified != 2 || st.Waived != 0 || st.Holders[0].State != takedowns.HolderEvicted {
			t.Fatalf("after the waived holder's receipt: %+v", st)
		}
		if file, err := e.o.Receipts(e.ctx, td.ID); err != nil || bytes.Count(file, []byte("\n")) != 2 {
			t.Fatalf("receipt file: %q %v", file, err)
		}
		// A node waived before any request, that reports again, is
		// requested like any late holder.
		e.report("edge-c", "seg-9f2c", "held", e.clock.Now())
		e.deliver()
		if _, err := e.o.Waive(e.ctx, td.ID, "edge-c", "lab device, wiped", "operator-2"); err != nil {
			t.Fatal(err)
		}
		e.deliver()
		if r := e.run(); r.LateRequests != 0 || r.Complete != 1 {
			t.Fatalf("run with edge-c waived: %+v", r)
		}
		e.clock.add(time.Second)
		e.report("edge-c", "seg-9f2c", "held", e.clock.Now())
		e.deliver()
		if r := e.run(); r.LateRequests != 1 || r.Complete != 0 {
			t.Fatalf("run after edge-c reported again: %+v", r)
		}
		e.deliver()
		e.run()
		e.deliver()
		if os := e.orders("edge-c"); len(os) != 1 {
			t.Fatalf("edge-c's orders: %+v", os)
		}
	})
}

// What an owner pass costs while nothing happens: per open takedown, the
// control source's target status (relaycore.GetTarget), one scan of its
// partition and one of its holder shard, plus one scan of the open list;
// no write.
// (The figure docs/takedown.md states.)
func TestRunCost(t *testing.T) {
	e := newEnv(t, mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{}))
	e.report("edge-a", "seg-9f2c", "held", e.clock.Now())
	e.deliver()
	const n = 10
	for range n {
		if _, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-1", takedowns.RequestOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.deliver()
	e.run()
	e.deliver()
	s0, d0, a0 := e.src.reads.Load(), e.dst.reads.Load(), e.src.applies.Load()+e.dst.applies.Load()
	if r := e.run(); r.Open != n || r.Ordered != 0 || r.Pending != n {
		t.Fatalf("run: %+v", r)
	}
	src, dst := e.src.reads.Load()-s0, e.dst.reads.Load()-d0
	if a := e.src.applies.Load() + e.dst.applies.Load() - a0; a != 0 {
		t.Errorf("an idle pass applied %d batches", a)
	}
	// The source reads are relaycore.GetTarget's on the control source
	// (today the os and rs records and the target's own records: 3).
	if src > 3*n || dst != 2*n+1 {
		t.Errorf("an idle pass over %d takedowns read %d source and %d target items/pages, want at most %d and %d", n, src, dst, 3*n, 2*n+1)
	}
}

// A complete takedown is watched for CloseAfter after its last receipt,
// then taken off the open list (once, by an idempotent commit); its status
// and receipts stay readable.
func TestCloseAfterComplete(t *testing.T) {
	e := newEnv(t, mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{}))
	e.o.CloseAfter = 48 * time.Hour
	td, ord := e.ordered()
	if _, err := e.o.Receipt(e.ctx, "edge-b", e.evict(e.pki, "edge-b", ord, e.clock.Now())); err != nil {
		t.Fatal(err)
	}
	e.deliver()
	e.clock.add(47 * time.Hour)
	if r := e.run(); r.Closed != 0 {
		t.Fatalf("an incomplete takedown closed: %+v", r)
	}
	if _, err := e.o.Waive(e.ctx, td.ID, "edge-a", "device destroyed", "operator-2"); err != nil {
		t.Fatal(err)
	}
	e.deliver()
	e.clock.add(47 * time.Hour)
	if r := e.run(); r.Closed != 0 || r.Complete != 1 {
		t.Fatalf("closed within CloseAfter of the waiver: %+v", r)
	}
	e.clock.add(time.Hour)
	if r := e.run(); r.Closed != 1 {
		t.Fatalf("not closed: %+v", r)
	}
	e.deliver()
	if r := e.run(); r.Open != 0 {
		t.Fatalf("still open: %+v", r)
	}
	if st := e.status(td.ID); !st.Complete || st.ReceiptsVerified != 1 || st.Waived != 1 {
		t.Fatalf("status after closing: %+v", st)
	}
}

// An open entry whose record never came (a request whose commits were cut
// short after it) is dropped once everything for it is delivered.
func TestOpenWithoutRecord(t *testing.T) {
	e := newEnv(t, mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{}))
	row := relaycore.Row{Target: takedowns.OpenTarget, Puts: []relaycore.KV{{Key: "1800000000123-00000000", Value: []byte("{}")}}}
	if _, err := e.relay.Enqueue(e.ctx, takedowns.ControlSource, []relaycore.Row{row}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	e.deliver()
	if r := e.run(); r.Open != 0 {
		t.Fatalf("run: %+v", r)
	}
	e.deliver()
	pg, err := relaycore.ReadTarget(e.ctx, e.dst, takedowns.OpenTarget, relaycore.TargetReadRequest{})
	if err != nil || len(pg.Items) != 0 {
		t.Fatalf("open list: %+v %v", pg.Items, err)
	}
}

// A request with an idempotency key is safe to retry: the retry answers
// the takedown the first opened and writes nothing; the key with another
// content or reason is refused; another caller's key is its own; and a
// request cut short after its record committed, before its holders'
// requests, is answered by its retry while the owner requests the same
// holders itself.
func TestRequestIdempotent(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		t0 := e.clock.Now()
		e.report("edge-a", "seg-9f2c", "held", t0)
		e.report("edge-b", "seg-9f2c", "held", t0)
		e.deliver()
		e.clock.add(time.Second)
		key := takedowns.RequestOptions{IdempotencyKey: "dmca-2026-118"}
		first, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-1", key)
		if err != nil || first.Replayed || strings.Join(first.Holders, ",") != "edge-a,edge-b" || first.Takedown.IdempotencyKey != key.IdempotencyKey {
			t.Fatalf("request: %+v %v", first, err)
		}
		retry := func(content, reason, by string, opts takedowns.RequestOptions) (takedowns.Opened, error) {
			t.Helper()
			before := e.src.applies.Load()
			op, err := e.o.Request(e.ctx, content, reason, by, opts)
			if n := e.src.applies.Load() - before; n != 0 && (err != nil || op.Replayed) {
				t.Fatalf("a retry answered %+v, %v and applied %d batches", op, err, n)
			}
			return op, err
		}
		if _, err := retry("seg-9f2c", "dmca 2026-118", "operator-1", key); !errors.Is(err, takedowns.ErrNotYet) {
			t.Fatalf("retry before the record is delivered: %v, want ErrNotYet", err)
		}
		e.deliver()
		e.clock.add(time.Minute)
		again, err := retry("seg-9f2c", "dmca 2026-118", "operator-1", key)
		if err != nil || !again.Replayed || again.Takedown != first.Takedown || strings.Join(again.Holders, ",") != "edge-a,edge-b" {
			t.Fatalf("retry: %+v %v, want %+v replayed", again, err, first)
		}
		for _, bad := range [][2]string{{"seg-9f2c", "another reason"}, {"seg-other", "dmca 2026-118"}} {
			if _, err := retry(bad[0], bad[1], "operator-1", key); !errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
				t.Errorf("the key with content %q, reason %q: %v, want ErrIdempotencyKeyReused", bad[0], bad[1], err)
			}
		}
		if _, err := retry("seg-9f2c", "dmca 2026-118", "operator-1", takedowns.RequestOptions{IdempotencyKey: "no spaces"}); !errors.Is(err, takedowns.ErrInvalid) {
			t.Errorf("a malformed key: %v, want ErrInvalid", err)
		}
		other, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-2", key)
		if err != nil || other.Replayed || other.Takedown.ID == first.Takedown.ID {
			t.Fatalf("another caller's request with the same key: %+v %v, want a takedown of its own", other, err)
		}

		// Cut short: the second batch (the holders' requests) fails.
		errCut := errors.New("injected: store unavailable")
		n := 0
		e.src.fault = func(relaycore.Batch) error {
			if n++; n == 2 {
				return errCut
			}
			return nil
		}
		cut := takedowns.RequestOptions{IdempotencyKey: "cut-short"}
		_, err = e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-119", "operator-1", cut)
		e.src.fault = nil
		// The takedown is open: answered as pending (retry with the key),
		// never as "nothing was changed" from the store's error.
		if !errors.Is(err, takedowns.ErrNotYet) || errors.Is(err, errCut) || !strings.Contains(err.Error(), "is open") {
			t.Fatalf("request cut short: %v, want ErrNotYet saying the takedown is open", err)
		}
		e.deliver()
		op, err := retry("seg-9f2c", "dmca 2026-119", "operator-1", cut)
		if err != nil || !op.Replayed || len(op.Holders) != 0 {
			t.Fatalf("retry of the request cut short: %+v %v, want it replayed without requests yet", op, err)
		}
		for range 3 {
			e.run()
			e.deliver()
		}
		op, err = retry("seg-9f2c", "dmca 2026-119", "operator-1", cut)
		if err != nil || strings.Join(op.Holders, ",") != "edge-a,edge-b" {
			t.Fatalf("after the owner's passes: %+v %v, want both holders requested", op, err)
		}
		for _, node := range []string{"edge-a", "edge-b"} {
			want := fmt.Sprintf("seg-9f2c/%s/%019d", node, op.Takedown.RequestedMS)
			found := false
			for _, o := range e.orders(node) {
				found = found || o.Request == want && o.Takedown == op.Takedown.ID
			}
			if !found {
				t.Errorf("%s has no order %s of takedown %s: %+v", node, want, op.Takedown.ID, e.orders(node))
			}
		}
		if st := e.status(first.Takedown.ID); st.HoldersExpected != 2 || st.IdempotencyKey != key.IdempotencyKey {
			t.Errorf("status of the first takedown: %+v", st)
		}

		// Past the key's lifetime (24 h) the same key opens another
		// takedown, and a retry of that request answers it, not the older
		// one still open.
		e.clock.add(25 * time.Hour)
		later, err := e.o.Request(e.ctx, "seg-9f2c", "dmca 2026-118", "operator-1", key)
		if err != nil || later.Replayed || later.Takedown.ID == first.Takedown.ID {
			t.Fatalf("the key after its lifetime: %+v %v, want a takedown of its own", later, err)
		}
		e.deliver()
		again, err = retry("seg-9f2c", "dmca 2026-118", "operator-1", key)
		if err != nil || !again.Replayed || again.Takedown.ID != later.Takedown.ID {
			t.Fatalf("retry of the later request: %+v %v, want takedown %s", again, err, later.Takedown.ID)
		}
	})
}
