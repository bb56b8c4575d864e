package relayapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/takedown"
)

// TestOrderEvictsAndReceiptVerifies: an order evicts the segment (its
// tombstone records the request), the cursor is stored, the receipt is
// posted and the relay accepts it after verifying it against the CA; the
// holdings reporter then reports the segment evicted. Pulling again
// applies nothing more.
func TestOrderEvictsAndReceiptVerifies(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	f.pass(f.walkPass)
	o := f.srv.AddOrder("edge-a", "seg-1", sha, "td-1", "dmca 1")
	f.srv.AddOrder("edge-b", "seg-1", sha, "td-1", "dmca 1") // not ours

	f.pass(f.agent.orderPass)
	tb, err := f.store.TombstoneOf("seg-1")
	if err != nil || tb.Request != o.Request {
		t.Fatalf("tombstone %+v, %v: want one for %s", tb, err, o.Request)
	}
	if c, _ := f.agent.cursor(); c != o.Cursor {
		t.Fatalf("cursor %q, want %q", c, o.Cursor)
	}
	f.pass(f.agent.receiptPass)
	line, ok := f.srv.Receipts()[o.Request]
	if !ok {
		t.Fatalf("no receipt accepted for %s", o.Request)
	}
	s, err := takedown.ParseLine([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := takedown.Verify(s, f.pool, time.Now()); err != nil || s.Receipt.SHA256 != sha || s.Receipt.Node != "edge-a" {
		t.Fatalf("receipt %+v: %v", s.Receipt, err)
	}
	f.pass(f.walkPass)
	if r := f.srv.Holdings("edge-a")["seg-1"]; r.State != takedown.StateEvicted || r.ObservedMS != tb.EvictedAt.UnixMilli() {
		t.Fatalf("holding after the takedown: %+v, want evicted at %v", r, tb.EvictedAt)
	}

	f.pass(f.agent.orderPass)
	f.pass(f.agent.receiptPass)
	gets := f.srv.Requests(relayapitest.Orders)
	if last := gets[len(gets)-1]; !strings.Contains(last.Query, "after="+o.Cursor) {
		t.Fatalf("second pull %q does not start after the cursor %s", last.Query, o.Cursor)
	}
	if n := len(f.srv.Requests(relayapitest.Receipts)); n != 1 {
		t.Fatalf("%d receipt posts, want 1", n)
	}
	st := f.agent.Status()
	if st.Orders.Counts[orderEvicted] != 1 || st.Receipts.Counts["accepted"] != 1 || st.Receipts.Pending != 0 || st.Cursor != o.Cursor {
		t.Fatalf("status %+v", st)
	}
}

// TestOrderNotHeld: an order for a segment this node neither holds nor
// took down is logged and counted, nothing is signed, and the cursor
// moves past it.
func TestOrderNotHeld(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	o := f.srv.AddOrder("edge-a", "seg-never", strings.Repeat("ab", 32), "td-1", "r")
	f.pass(f.agent.orderPass)
	if c, _ := f.agent.cursor(); c != o.Cursor {
		t.Fatalf("cursor %q, want %q", c, o.Cursor)
	}
	rs, err := f.store.Receipts("")
	if err != nil || len(rs) != 0 {
		t.Fatalf("receipts %v %v: want none", rs, err)
	}
	if _, err := f.store.TombstoneOf("seg-never"); !errors.Is(err, segstore.ErrNotFound) {
		t.Fatalf("tombstone for a segment never held: %v", err)
	}
	if n := f.agent.Status().Orders.Counts[orderNotHeld]; n != 1 {
		t.Fatalf("not_held %d", n)
	}
}

// TestOrderCursorOnlyWhenHandled: the cursor stays where it is while the
// orders cannot be read (503, the relay down) or an order cannot be
// applied (its segment being written), and the order is applied on the
// next pass.
func TestOrderCursorOnlyWhenHandled(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	o := f.srv.AddOrder("edge-a", "seg-1", sha, "td-1", "r")
	f.srv.Inject(relayapitest.Orders, relayapitest.Unavailable)
	if err := f.agent.orderPass(context.Background()); err == nil || !retryable(err) {
		t.Fatalf("503: %v", err)
	}
	f.srv.Down()
	if err := f.agent.orderPass(context.Background()); err == nil || !retryable(err) {
		t.Fatalf("relay down: %v", err)
	}
	f.srv.Up()
	busy := f.agent.evict
	f.agent.evict = func(string, string) (bool, error) { return false, segstore.ErrBusy }
	if err := f.agent.orderPass(context.Background()); !errors.Is(err, segstore.ErrBusy) {
		t.Fatalf("busy segment: %v", err)
	}
	if c, _ := f.agent.cursor(); c != "" {
		t.Fatalf("cursor %q moved past an order not applied", c)
	}
	f.agent.evict = busy
	f.pass(f.agent.orderPass)
	if c, _ := f.agent.cursor(); c != o.Cursor {
		t.Fatalf("cursor %q, want %q", c, o.Cursor)
	}
	if _, err := f.store.TombstoneOf("seg-1"); err != nil {
		t.Fatal(err)
	}
}

// TestOrdersPaged: orders beyond one page are read page after page in one
// pass, each applied once, in order; the answer's lost on the last page
// changes nothing (the orders are applied again, idempotently).
func TestOrdersPaged(t *testing.T) {
	f := newFixture(t, "edge-a", func(c *config.RelayAPI) { c.Batch = 2 })
	var last relayapitest.Order
	for i := range 5 {
		id := fmt.Sprintf("seg-%d", i)
		last = f.srv.AddOrder("edge-a", id, f.put(id, []byte(id)), "td", "r")
	}
	f.pass(f.agent.orderPass)
	if c, _ := f.agent.cursor(); c != last.Cursor {
		t.Fatalf("cursor %q, want %q", c, last.Cursor)
	}
	if n := len(f.srv.Requests(relayapitest.Orders)); n != 3 {
		t.Fatalf("%d pages, want 3", n)
	}
	rs, _ := f.store.Receipts("")
	if len(rs) != 5 {
		t.Fatalf("%d receipts", len(rs))
	}
	if st := f.agent.Status().Orders; st.Counts[orderEvicted] != 5 {
		t.Fatalf("status %+v", st)
	}
}

// TestOrderOtherNode: a page of orders for another node is not applied.
func TestOrderOtherNode(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	f.cert = issue(t, f.pkiDir, "edge-b")
	f.srv.AddOrder("edge-b", "seg-1", sha, "td", "r")
	err := f.agent.orderPass(context.Background())
	if err == nil || retryable(err) {
		t.Fatalf("orders of edge-b: %v, want a refusal", err)
	}
	if _, err := f.store.TombstoneOf("seg-1"); !errors.Is(err, segstore.ErrNotFound) {
		t.Fatalf("edge-b's order applied on edge-a: %v", err)
	}
}
