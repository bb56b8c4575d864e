package relayapi

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
	"github.com/relay-dev/relay/edge/takedown"
)

// TestHoldingsDifference: the first pass reports every segment held, a
// pass with nothing changed sends nothing, and then only what changed is
// reported: a new segment held, an evicted one evicted with the digest it
// had.
func TestHoldingsDifference(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	want := map[string]string{}
	for i := range 3 {
		id := fmt.Sprintf("seg-%d", i)
		want[id] = f.put(id, []byte(id))
	}
	f.pass(f.walkPass)
	if got := f.held(); !maps.Equal(got, want) {
		t.Fatalf("relay holds %v, want %v", got, want)
	}
	f.pass(f.walkPass)
	if n := len(f.srv.Requests(relayapitest.Holdings)); n != 1 {
		t.Fatalf("%d holdings requests, want 1: a pass with nothing changed sends nothing", n)
	}
	want["seg-9"] = f.put("seg-9", []byte("nine"))
	if err := f.store.Evict("seg-1"); err != nil {
		t.Fatal(err)
	}
	delete(want, "seg-1")
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 2 {
		t.Fatalf("%d holdings requests, want 2", len(reqs))
	}
	if got := f.held(); !maps.Equal(got, want) {
		t.Fatalf("relay holds %v, want %v", got, want)
	}
	applied := f.srv.Applied(f.node)
	if len(applied) != 5 || applied[3].ContentID != "seg-1" || applied[3].State != takedown.StateEvicted || applied[4].ContentID != "seg-9" {
		t.Fatalf("reports applied: %+v; want 3 held, then seg-1 evicted and seg-9 held", applied)
	}
	if applied[3].SHA256 == "" || applied[3].Size != int64(len("seg-1")) {
		t.Fatalf("evicted report without the digest and size it had: %+v", applied[3])
	}
	if st := f.agent.Status().Holdings; st.Counts["sent"] != 5 || st.Pending != 0 {
		t.Fatalf("status: %+v", st)
	}
}

// TestHoldingsReportedOnStore: a store signals the reporter (the store's
// OnCommit, as edged wires it), which reports the segment without waiting
// for relay_api.report_interval (an hour here: only the signal can start
// the pass). Such a pass compares only the segments stored, not the whole
// index, so an eviction no store signalled waits for a walk: the
// interval's, or the one a takedown asks for (Changed).
func TestHoldingsReportedOnStore(t *testing.T) {
	f := newFixture(t, "edge-a", func(c *config.RelayAPI) { c.ReportInterval, c.ReportDelay = time.Hour, time.Millisecond })
	f.put("seg-1", []byte("one"))
	f.run()
	eventually(t, "seg-1 reported by the pass at start", func() bool { return f.held()["seg-1"] != "" })
	if err := f.store.Evict("seg-1"); err != nil {
		t.Fatal(err)
	}
	sha := f.put("seg-2", []byte("two"))
	eventually(t, "seg-2 reported after its store", func() bool { return f.held()["seg-2"] == sha })
	if f.held()["seg-1"] == "" {
		t.Fatal("a pass a store started walked the index: seg-1's eviction was reported with it")
	}
	if n := len(f.srv.Requests(relayapitest.Holdings)); n != 2 {
		t.Fatalf("%d holdings requests, want 2", n)
	}
	f.agent.Changed()
	eventually(t, "seg-1's eviction reported after a takedown's walk", func() bool { return f.held()["seg-1"] == "" })
}

// TestHoldingsLostAnswer: the relay applies a batch and the answer is
// lost. The retry repeats the key and the body byte for byte, the relay
// answers replayed, nothing is applied twice, and the node then knows the
// relay has them.
func TestHoldingsLostAnswer(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.put("seg-1", []byte("one"))
	f.put("seg-2", []byte("two"))
	f.srv.Inject(relayapitest.Holdings, relayapitest.LoseAnswer)
	if err := f.agent.reportPass(context.Background(), false); err == nil || !retryable(err) {
		t.Fatalf("pass with the answer lost: %v, want a retryable error", err)
	}
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want the batch and its retry", len(reqs))
	}
	if reqs[0].Key != reqs[1].Key || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("retry differs: key %q body %s, then key %q body %s", reqs[0].Key, reqs[0].Body, reqs[1].Key, reqs[1].Body)
	}
	if n := len(f.srv.Applied(f.node)); n != 2 {
		t.Fatalf("%d reports applied, want 2 (the replay applies nothing)", n)
	}
	f.pass(f.walkPass)
	if n := len(f.srv.Requests(relayapitest.Holdings)); n != 2 {
		t.Fatalf("%d requests after a quiet pass, want 2", n)
	}
}

// TestHoldingsRetriedAcrossRestart: a batch whose answer was lost is sent
// again after a restart, with the same key and body; then a node that was
// offline (the relay down) while segments came and went reports exactly
// the difference once the relay is back.
func TestHoldingsRetriedAcrossRestart(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.put("seg-1", []byte("one"))
	f.put("seg-2", []byte("two"))
	f.srv.Inject(relayapitest.Holdings, relayapitest.LoseAnswer)
	if err := f.agent.reportPass(context.Background(), false); err == nil {
		t.Fatal("pass with the answer lost succeeded")
	}
	f.restart()
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 2 || reqs[0].Key != reqs[1].Key || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("after the restart: %d requests %+v, want the same batch again", len(reqs), reqs)
	}

	f.srv.Down()
	f.put("seg-3", []byte("three"))
	if err := f.store.Evict("seg-1"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.agent.reportPass(context.Background(), false); err == nil || !retryable(err) {
			t.Fatalf("pass with the relay down: %v, want a retryable error", err)
		}
	}
	f.restart()
	f.srv.Up()
	f.pass(f.walkPass)
	applied := f.srv.Applied(f.node)
	if len(applied) != 4 || applied[2].ContentID != "seg-1" || applied[2].State != takedown.StateEvicted || applied[3].ContentID != "seg-3" || applied[3].State != takedown.StateHeld {
		t.Fatalf("applied %+v, want seg-1 and seg-2 held, then exactly seg-1 evicted and seg-3 held", applied)
	}
}

// TestHoldingsBatches: reports go in batches of relay_api.batch, in id
// order, each under a key of its own.
func TestHoldingsBatches(t *testing.T) {
	f := newFixture(t, "edge-a", func(c *config.RelayAPI) { c.Batch = 2 })
	for i := range 5 {
		f.put(fmt.Sprintf("seg-%d", i), []byte{byte(i)})
	}
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 3 {
		t.Fatalf("%d batches, want 3", len(reqs))
	}
	keys := map[string]bool{}
	for _, r := range reqs {
		keys[r.Key] = true
	}
	if len(keys) != 3 {
		t.Fatalf("keys %v: want one per batch", keys)
	}
	applied := f.srv.Applied(f.node)
	for i, r := range applied {
		if r.ContentID != fmt.Sprintf("seg-%d", i) {
			t.Fatalf("report %d is %s: want id order", i, r.ContentID)
		}
	}
}

// TestHoldingsRefused: a batch the relay refuses (4xx) is not retried as
// is; its reports are sent again in a new batch, under a new key, at the
// next pass.
func TestHoldingsRefused(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.put("seg-1", []byte("one"))
	f.srv.Inject(relayapitest.Holdings, relayapitest.Refuse)
	err := f.agent.reportPass(context.Background(), false)
	if err == nil || retryable(err) {
		t.Fatalf("refused batch: %v, want an error not retried", err)
	}
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 2 || reqs[0].Key == reqs[1].Key {
		t.Fatalf("requests %+v: want the reports again under a new key", reqs)
	}
	if got := f.held(); len(got) != 1 {
		t.Fatalf("relay holds %v", got)
	}
}

// TestHoldingsRebuiltDatabase: a node whose edged.db is new (rebuilt at
// start, the segment files kept) reports everything again, under keys
// of a new epoch: none collides with a batch the relay saw from the old
// database (the server would count a reused key with another body as a
// contract violation).
func TestHoldingsRebuiltDatabase(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.put("seg-1", []byte("one"))
	f.pass(f.walkPass)
	f.put("seg-2", []byte("two"))
	if err := f.db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(f.dir, "edged.db"), filepath.Join(f.dir, "edged.db.damaged")); err != nil {
		t.Fatal(err)
	}
	f.open() // the store rebuilds its index from the files
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 2 || reqs[0].Key == reqs[1].Key {
		t.Fatalf("requests %+v", reqs)
	}
	if got := f.held(); len(got) != 2 {
		t.Fatalf("relay holds %v, want both", got)
	}
	if n := len(f.srv.Applied(f.node)); n != 3 {
		t.Fatalf("%d reports applied, want 1 + 2 (everything again)", n)
	}
}

// TestHoldingsOtherNode: an answer for another node than this one (the
// relay took the certificate for another node's) is an error; the node
// does not take the reports as delivered.
func TestHoldingsOtherNode(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.cert = issue(t, f.pkiDir, "edge-b")
	f.put("seg-1", []byte("one"))
	if err := f.agent.reportPass(context.Background(), false); err == nil {
		t.Fatal("answer for edge-b taken as edge-a's")
	}
	p, ok, err := f.agent.pendingBatch()
	if err != nil || ok {
		t.Fatalf("pending batch %+v %v %v: want it dropped", p, ok, err)
	}
}

// TestBackoff: min(max, initial·2^(n-1)) scaled by the node's spread,
// which lies in (0.75, 1] and differs between nodes.
func TestBackoff(t *testing.T) {
	f := newFixture(t, "edge-a", func(c *config.RelayAPI) {
		c.Backoff = config.Backoff{Initial: 1000, Max: 5000}
	})
	a := f.agent
	if a.spread <= 0.75 || a.spread > 1 {
		t.Fatalf("spread %v", a.spread)
	}
	for n, want := range map[int]int64{1: 1000, 2: 2000, 3: 4000, 4: 5000, 40: 5000} {
		if got := a.backoff(n); got != a.scaled(time.Duration(want)) {
			t.Errorf("backoff(%d) = %v, want %v·spread", n, got, want)
		}
	}
	b, _ := New(Options{Node: "edge-b", Config: f.cfg, DB: f.db, Store: f.store})
	if b.spread == a.spread {
		t.Errorf("edge-a and edge-b have the same spread %v", a.spread)
	}
}

// TestHoldingsTooLarge: a 413 (the relay's bound on one request is below
// relay_api.batch) halves the batch: the reports go again in smaller
// batches.
func TestHoldingsTooLarge(t *testing.T) {
	f := newFixture(t, "edge-a", func(c *config.RelayAPI) { c.Batch = 4 })
	for i := range 4 {
		f.put(fmt.Sprintf("seg-%d", i), []byte{byte(i)})
	}
	f.srv.Inject(relayapitest.Holdings, relayapitest.TooLarge)
	if err := f.agent.reportPass(context.Background(), false); err == nil || retryable(err) {
		t.Fatalf("413: %v", err)
	}
	f.pass(f.walkPass)
	reqs := f.srv.Requests(relayapitest.Holdings)
	if len(reqs) != 3 || len(f.srv.Applied(f.node)) != 4 {
		t.Fatalf("%d requests, %d reports applied: want the refused 4 and then 2 batches of 2", len(reqs), len(f.srv.Applied(f.node)))
	}
}
