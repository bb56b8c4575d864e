package relayapi

import (
	"context"
	"testing"

	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
)

// TestReceiptPostedAfterRestart: the eviction committed (receipt stored,
// cursor moved) and the node died before posting; the next start posts
// it. A 503 and a lost answer are retried, the second post of the same
// receipt answered replayed; the verdict is kept, so nothing is posted
// again.
func TestReceiptPostedAfterRestart(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	o := f.srv.AddOrder("edge-a", "seg-1", sha, "td-1", "r")
	f.pass(f.agent.orderPass)
	f.restart() // as after kill -9: only what bbolt committed remains

	f.srv.Inject(relayapitest.Receipts, relayapitest.Unavailable, relayapitest.LoseAnswer)
	for range 2 {
		if err := f.agent.receiptPass(context.Background()); err == nil || !retryable(err) {
			t.Fatalf("pass: %v, want a retryable error", err)
		}
		if p := f.agent.Status().Receipts.Pending; p != 1 {
			t.Fatalf("pending %d, want 1", p)
		}
	}
	f.pass(f.agent.receiptPass)
	if _, ok := f.srv.Receipts()[o.Request]; !ok {
		t.Fatal("receipt not accepted")
	}
	if st := f.agent.Status().Receipts; st.Counts["replayed"] != 1 || st.Pending != 0 {
		t.Fatalf("status %+v: want the post after the lost answer replayed", st)
	}
	f.restart()
	f.pass(f.agent.receiptPass)
	if n := len(f.srv.Requests(relayapitest.Receipts)); n != 3 {
		t.Fatalf("%d posts, want 3 (503, lost answer, replayed) and none after", n)
	}
}

// TestReceiptRefused: a receipt the relay refuses (422: no order for
// that request, as for an operator's own edgectl takedown evict) is
// recorded, counted and shown in the status, and not posted again.
func TestReceiptRefused(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	f.put("seg-1", []byte("one"))
	if _, err := f.evict("seg-1", "operator-1"); err != nil {
		t.Fatal(err)
	}
	f.pass(f.agent.receiptPass) // a refusal does not fail the pass
	st := f.agent.Status().Receipts
	if st.Counts["refused"] != 1 || st.Pending != 0 || st.LastRefusal == "" {
		t.Fatalf("status %+v", st)
	}
	f.pass(f.agent.receiptPass)
	if n := len(f.srv.Requests(relayapitest.Receipts)); n != 1 {
		t.Fatalf("%d posts, want 1", n)
	}
}
