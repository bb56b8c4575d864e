package relaycore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// recordingHook records every request and can fail or add writes.
type recordingHook struct {
	mu    sync.Mutex
	reqs  []relaycore.HookRequest
	fail  map[relaycore.Partition]bool
	extra func(req relaycore.HookRequest) []relaycore.Write
}

func (h *recordingHook) BeforeApply(_ context.Context, req relaycore.HookRequest) ([]relaycore.Write, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reqs = append(h.reqs, req)
	if h.fail[req.Target] {
		return nil, fmt.Errorf("hook refuses %s", req.Target)
	}
	if h.extra != nil {
		return h.extra(req), nil
	}
	return nil, nil
}

func TestHookRunsBeforeEveryAttemptIncludingRetry(t *testing.T) {
	e := newEnv(t, "free")
	hook := &recordingHook{extra: func(req relaycore.HookRequest) []relaycore.Write {
		return []relaycore.Write{{Key: "audit/" + fmt.Sprint(req.Rows[len(req.Rows)-1].Seq), Value: []byte("seen")}}
	}}
	e.h.Hook = hook
	e.enqueue(put("t", "k", "1"), put("t", "k", "2"))
	raced := false
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" && !raced {
			raced = true // a concurrent deliverer applied seq 1 first
			return e.tgt.Apply(e.ctx, "t", relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.RHKey(e.source), Value: []byte("1")}}})
		}
		return nil
	}, nil)
	e.fire(e.source)
	if len(hook.reqs) != 2 || hook.reqs[0].Attempt != 1 || hook.reqs[1].Attempt != 2 {
		t.Fatalf("hook requests %+v, want attempts 1 and 2", hook.reqs)
	}
	if got := hook.reqs[1].Rows; len(got) != 1 || got[0].Seq != 2 {
		t.Fatalf("retry offered rows %+v, want only seq 2", got)
	}
	if v, _ := e.target("t", "audit/2"); v != "seen" {
		t.Fatal("hook write not applied with the rows")
	}
}

func TestHookShrinksGroupToFitAdditions(t *testing.T) {
	e := newEnv(t, "free")
	hook := &recordingHook{extra: func(req relaycore.HookRequest) []relaycore.Write {
		// One hook write per row: 60 rows of one key each cannot fit 100 items.
		var ws []relaycore.Write
		for _, r := range req.Rows {
			ws = append(ws, relaycore.Write{Key: fmt.Sprintf("h/%d", r.Seq), Value: []byte("x")})
		}
		return ws
	}}
	e.h.Hook = hook
	var rows []relaycore.Row
	for i := 0; i < 60; i++ {
		rows = append(rows, put("t", fmt.Sprintf("k%d", i), "v"))
	}
	e.enqueue(rows...)
	e.drain(e.source, 10)
	shrunk := false
	for i := 1; i < len(hook.reqs); i++ {
		if hook.reqs[i].Attempt == hook.reqs[i-1].Attempt && len(hook.reqs[i].Rows) < len(hook.reqs[i-1].Rows) {
			shrunk = true
		}
	}
	if !shrunk {
		t.Fatal("the hook was not asked again after the group shrank")
	}
	for i := 0; i < 60; i++ {
		if v, _ := e.target("t", fmt.Sprintf("h/%d", i+1)); v != "x" {
			t.Fatalf("hook effect of row %d missing", i+1)
		}
	}
}

func TestHookErrorBlocksOnlyThatTarget(t *testing.T) {
	e := newEnv(t, "free")
	hook := &recordingHook{fail: map[relaycore.Partition]bool{"t1": true}}
	e.h.Hook = hook
	e.enqueue(put("t1", "k", "1"), put("t2", "k", "1"))
	r := e.fire(e.source)
	if r.TargetsBlocked != 1 || r.RowsDelivered != 1 {
		t.Fatalf("%+v: want t1 blocked and t2 delivered", r)
	}
	if _, ok := e.target("t1", "k"); ok {
		t.Fatal("t1 applied despite its hook error")
	}
	hook.fail = nil
	e.drain(e.source, 10)
	if v, _ := e.target("t1", "k"); v != "1" {
		t.Fatal("t1 not delivered after the hook recovered")
	}
}

func TestHolderRelayHook(t *testing.T) {
	e := newEnv(t, "free")
	e.h.Hook = relaycore.HolderRelayHook{Prefix: "holder/", Observations: map[relaycore.Partition][]relaycore.KV{
		"t": {{Key: "node-7", Value: []byte("holds")}},
	}}
	e.enqueue(put("t", "k", "v"), put("u", "k", "v"))
	e.drain(e.source, 10)
	if v, _ := e.target("t", "holder/node-7"); v != "holds" {
		t.Fatal("holder observation not recorded at t")
	}
	if _, ok := e.target("u", "holder/node-7"); ok {
		t.Fatal("observation leaked to another target")
	}
}
