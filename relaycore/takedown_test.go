package relaycore_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

func takedownReq(content, holder string, ms int64) relaycore.ContentTakedownV1 {
	return relaycore.ContentTakedownV1{Version: 1, ContentID: content, LateHolder: holder, RequestedMS: ms, Reason: "dmca 2026-118"}
}

func takedownRow(t *testing.T, target relaycore.Partition, req relaycore.ContentTakedownV1) relaycore.Row {
	t.Helper()
	r, err := relaycore.NewTakedownRow(target, req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The handoff is written in the same target batch as the row that carries
// the request and the rh advance, so it lands exactly when the request does:
// a failed apply leaves neither, the next one both.
func TestTakedownHandoffLandsAtomicallyWithRow(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Hook = relaycore.TakedownRequestTimer{Delay: 24 * time.Hour}
	req := takedownReq("seg-9f2c", "edge-7", 1_800_000_000_123)
	e.enqueue(put("t", "content/seg-9f2c", "gone"), takedownRow(t, "t", req))

	var batches []relaycore.Batch
	fail := true
	e.tgtF.set(func(c call) error {
		if c.Op != "apply" {
			return nil
		}
		batches = append(batches, c.Batch)
		if fail {
			fail = false
			return errInjected
		}
		return nil
	}, nil)
	if r := e.fire(e.source); r.TargetsBlocked != 1 {
		t.Fatalf("%+v: want the failed target blocked", r)
	}
	for _, k := range []string{relaycore.TakedownKey(req), relaycore.TakedownHandoffKey(req), relaycore.RHKey(e.source)} {
		if _, ok := e.target("t", k); ok {
			t.Fatalf("%s present after a failed apply", k)
		}
	}
	e.drain(e.source, 10)
	last := batches[len(batches)-1]
	var keys []string
	for _, w := range last.Writes {
		keys = append(keys, w.Key)
	}
	for _, k := range []string{"content/seg-9f2c", relaycore.TakedownKey(req), relaycore.TakedownHandoffKey(req), relaycore.RHKey(e.source)} {
		if !slices.Contains(keys, k) {
			t.Fatalf("applied batch writes %v, missing %s", keys, k)
		}
	}
	raw, ok := e.target("t", relaycore.TakedownHandoffKey(req))
	if !ok {
		t.Fatal("no handoff after delivery")
	}
	h, err := relaycore.DecodeTakedownHandoff([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if h.Request != req || h.TimerDueMS != req.RequestedMS+(24*time.Hour).Milliseconds() {
		t.Fatalf("handoff %+v", h)
	}
	if got, _ := e.target("t", relaycore.TakedownKey(req)); got == "" {
		t.Fatal("the request itself is not retained at the target")
	}
}

// Redelivery never duplicates a handoff or resets its timer: the same rows
// re-offered after a crash before cleanup apply no target batch; the same
// request enqueued again, later, rewrites the identical record; asking the
// hook again yields identical writes; a distinct later request for the same
// content and holder gets its own record and leaves the first one's timer.
func TestTakedownRedeliveryKeepsTimer(t *testing.T) {
	e := newEnv(t, "free")
	hook := relaycore.TakedownRequestTimer{Delay: time.Hour}
	e.h.Hook = hook
	req := takedownReq("seg-1", "edge-7", 1_800_000_000_000)
	e.enqueue(takedownRow(t, "t", req))

	// Crash after the target apply, before the source checkpoint.
	e.srcF.set(func(c call) error {
		if c.Op == "apply" && slices.ContainsFunc(c.Batch.Writes, func(w relaycore.Write) bool { return strings.HasPrefix(w.Key, layout.PagePrefix) }) {
			return errInjected
		}
		return nil
	}, nil)
	if _, err := e.h.Fire(e.ctx, e.source); err == nil {
		t.Fatal("checkpoint should have failed")
	}
	e.srcF.set(nil, nil)
	first, _ := e.target("t", relaycore.TakedownHandoffKey(req))
	applies := e.countTargetApplies()
	e.clock.Advance(time.Minute) // let the crashed fire's claim lapse
	e.drain(e.source, 10)
	if *applies != 0 {
		t.Fatalf("redelivery applied %d target batches, want 0", *applies)
	}

	// The same request again, much later, in a new row.
	e.clock.Advance(48 * time.Hour)
	e.tgtF.set(nil, nil)
	e.enqueue(takedownRow(t, "t", req))
	e.drain(e.source, 10)
	again, _ := e.target("t", relaycore.TakedownHandoffKey(req))
	if again != first {
		t.Fatalf("re-sent request changed the handoff:\n%s\n%s", first, again)
	}

	// Asking the hook twice gives the same writes.
	hr := relaycore.HookRequest{Source: e.source, Target: "t", Rows: []relaycore.Row{takedownRow(t, "t", req)}, Attempt: 1}
	w1, err1 := hook.BeforeApply(e.ctx, hr)
	hr.Attempt = 2
	w2, err2 := hook.BeforeApply(e.ctx, hr)
	if err1 != nil || err2 != nil || len(w1) != 1 || len(w2) != 1 || w1[0].Key != w2[0].Key || string(w1[0].Value) != string(w2[0].Value) {
		t.Fatalf("hook not deterministic: %v %v / %v %v", w1, err1, w2, err2)
	}

	// A distinct, later request for the same content and holder.
	later := req
	later.RequestedMS += 5000
	e.enqueue(takedownRow(t, "t", later))
	e.drain(e.source, 10)
	if got, _ := e.target("t", relaycore.TakedownHandoffKey(req)); got != first {
		t.Fatal("a later request reset the first request's timer")
	}
	h, err := relaycore.DecodeTakedownHandoff([]byte(mustTarget(t, e, "t", relaycore.TakedownHandoffKey(later))))
	if err != nil || h.TimerDueMS != later.RequestedMS+time.Hour.Milliseconds() {
		t.Fatalf("later request's handoff %+v, %v", h, err)
	}
}

func mustTarget(t *testing.T, e *env, p relaycore.Partition, key string) string {
	t.Helper()
	v, ok := e.target(p, key)
	if !ok {
		t.Fatalf("%s/%s absent", p, key)
	}
	return v
}

// Running the launch consumer acknowledges nothing: after delivery the
// target holds the request, the handoff and rh, and nothing else; the
// handoff has exactly the request and the timer; the hook's writes are
// puts of handoff keys only; and a row that would delete (consume) or forge a
// handoff is refused.
func TestTakedownNothingAcknowledged(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Hook = relaycore.TakedownRequestTimer{}
	req := takedownReq("seg-2", "edge-3", 1_800_000_000_000)
	e.enqueue(takedownRow(t, "t", req))
	e.drain(e.source, 10)
	pg, err := e.tgt.Scan(e.ctx, "t", relaycore.ScanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, it := range pg.Items {
		keys = append(keys, it.Key)
	}
	want := []string{relaycore.RHKey(e.source), relaycore.TakedownHandoffKey(req), relaycore.TakedownKey(req)}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("target keys %v, want exactly %v", keys, want)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(mustTarget(t, e, "t", relaycore.TakedownHandoffKey(req))), &fields); err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range fields {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Equal(names, []string{"request", "timer_due_ms", "v"}) {
		t.Fatalf("handoff fields %v: only the request and the timer belong there", names)
	}

	ws, err := relaycore.TakedownRequestTimer{}.BeforeApply(e.ctx, relaycore.HookRequest{Target: "t", Rows: []relaycore.Row{
		takedownRow(t, "t", req), takedownRow(t, "t", takedownReq("seg-3", "edge-3", 5)), put("t", "plain", "x"), del("t", relaycore.TakedownKey(req)),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Delete || !strings.HasPrefix(w.Key, relaycore.TakedownHandoffPrefix) || w.Due != 0 {
			t.Fatalf("hook write %+v: only puts of handoff records are allowed", w)
		}
	}
	if len(ws) != 2 {
		t.Fatalf("%d hook writes for two requests", len(ws))
	}
}

// Malformed requests are refused with a clear error: the target is blocked
// for the cycle, its rows stay queued, nothing lands there, and other
// targets are delivered.
func TestTakedownMalformedRequestBlocksTarget(t *testing.T) {
	good := takedownReq("seg-4", "edge-1", 1_800_000_000_000)
	goodRaw, _ := relaycore.EncodeTakedown(good)
	key := relaycore.TakedownKey(good)
	withField := func(f func(m map[string]any)) string {
		var m map[string]any
		_ = json.Unmarshal(goodRaw, &m)
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	cases := []struct {
		name, key, value, reason string
		deletes                  bool
	}{
		{"not json", key, "takedown!", "not a version-1 request", false},
		{"version 2", key, withField(func(m map[string]any) { m["v"] = 2 }), "version 2", false},
		{"unknown field", key, withField(func(m map[string]any) { m["acked"] = true }), "unknown field", false},
		{"trailing data", key, string(goodRaw) + "{}", "data after the object", false},
		{"empty content id", key, withField(func(m map[string]any) { m["content_id"] = "" }), "content id", false},
		{"holder with slash", key, withField(func(m map[string]any) { m["late_holder"] = "a/b" }), "late holder", false},
		{"no time", key, withField(func(m map[string]any) { m["requested_ms"] = 0 }), "requested_ms", false},
		{"no reason", key, withField(func(m map[string]any) { m["reason"] = "" }), "reason", false},
		{"key does not name it", relaycore.TakedownPrefix + "seg-4/edge-2/0001800000000000", string(goodRaw), "does not name its request", false},
		{"forged handoff", relaycore.TakedownHandoffKey(good), string(goodRaw), "may not write a takedown handoff", false},
		{"consumed handoff", relaycore.TakedownHandoffKey(good), "", "may not delete a takedown handoff", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.Hook = relaycore.TakedownRequestTimer{}
			bad := put("t", tc.key, tc.value)
			if tc.deletes {
				bad = del("t", tc.key)
			}
			e.enqueue(put("t", "before", "1"), bad, put("u", "k", "v"))
			r := e.fire(e.source)
			if r.TargetsBlocked != 1 || r.RowsDelivered != 1 {
				t.Fatalf("%+v: want t blocked and u delivered", r)
			}
			if rows := e.inspect(e.source).Rows(); len(rows) != 2 || rows[0].Target != "t" {
				t.Fatalf("outbox %+v: want t's two rows kept", rows)
			}
			for _, k := range []string{"before", relaycore.RHKey(e.source), tc.key, relaycore.TakedownHandoffKey(good)} {
				if _, ok := e.target("t", k); ok {
					t.Fatalf("%s landed at the blocked target", k)
				}
			}
			_, err := relaycore.TakedownRequestTimer{}.BeforeApply(context.Background(), relaycore.HookRequest{Target: "t", Rows: []relaycore.Row{bad}})
			var te *relaycore.TakedownError
			if !errors.Is(err, relaycore.ErrInvalidTakedown) || !errors.As(err, &te) || te.Key != tc.key || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %v: want ErrInvalidTakedown naming %q and %q", err, tc.key, tc.reason)
			}
		})
	}
}

func TestTakedownRequestValidation(t *testing.T) {
	if _, err := relaycore.NewTakedownRow("t", takedownReq("seg.1", "edge_7", 1)); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	if _, err := relaycore.NewTakedownRow("t", takedownReq(".seg", "edge", 1)); !errors.Is(err, relaycore.ErrInvalidTakedown) {
		t.Fatalf("content id starting with '.' accepted: %v", err)
	}
	if _, err := (relaycore.TakedownRequestTimer{Delay: -time.Second}).BeforeApply(context.Background(), relaycore.HookRequest{}); err == nil {
		t.Fatal("negative delay accepted")
	}
	if k := relaycore.TakedownKey(takedownReq("c", "h", 42)); k != "takedown/c/h/0000000000000000042" {
		t.Fatalf("key %q", k)
	}
}
