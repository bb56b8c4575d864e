package takedowns

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/relaycore"
)

// MaxOrdersPage bounds one page of Orders (the contract's limit).
const MaxOrdersPage = 500

// Orders reads node's orders after cursor (""), oldest first, at most
// limit; next is the cursor to read on from, or "" when there are no more
// for now. Only node's own partition is read: there is no way to name
// another's.
func (o *Owner) Orders(ctx context.Context, node, after string, limit int) (orders []Order, next string, err error) {
	if err := CheckNode(node); err != nil {
		return nil, "", err
	}
	if after != "" && (len(after) != 20 || strings.Trim(after, "0123456789") != "") {
		return nil, "", invalid("after %q is not a cursor this relay returned", after)
	}
	if limit < 1 || limit > MaxOrdersPage {
		return nil, "", invalid("limit %d: want 1..%d", limit, MaxOrdersPage)
	}
	req := relaycore.TargetReadRequest{Prefix: orderSeqPfx, Limit: limit}
	if after != "" {
		req.After = orderSeqPfx + after
	}
	pg, err := relaycore.ReadTarget(ctx, o.Relay.Target, OrdersTarget(node), req)
	if err != nil {
		return nil, "", err
	}
	orders = []Order{}
	for _, it := range pg.Items {
		var ord Order
		if err := json.Unmarshal(it.Value, &ord); err != nil {
			return nil, "", fmt.Errorf("%w: order %s of %s: %v", relaycore.ErrCorruptRecord, it.Key, node, err)
		}
		ord.Cursor = strings.TrimPrefix(it.Key, orderSeqPfx)
		orders = append(orders, ord)
	}
	if pg.Next != "" {
		next = strings.TrimPrefix(pg.Next, orderSeqPfx)
	}
	return orders, next, nil
}

// ReceiptResult answers Receipt.
type ReceiptResult struct {
	Request  string
	Takedown string
	// Replayed: this receipt was accepted before; nothing was written now.
	Replayed bool
}

// Receipt accepts node's signed eviction receipt (one line of a receipt
// file, docs/takedown.md) once it proves what the takedown needs: it
// verifies against Roots (edge/takedown.Verify: the signature, the chain at
// evicted_at, a node certificate naming the receipt's node, not dated in
// the future), and then what only the relay knows: the receipt's node is
// the caller, the relay ordered that very request to that node, for that
// content and the digest the holder index had, and the eviction is not
// dated before the request (allowing takedown.MaxClockSkew). Anything else
// is ErrRefused with the reason, and nothing is written. The same receipt
// again answers Replayed.
func (o *Owner) Receipt(ctx context.Context, node string, line []byte) (ReceiptResult, error) {
	if err := CheckNode(node); err != nil {
		return ReceiptResult{}, err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	s, err := takedown.ParseLine(line)
	if err != nil {
		return ReceiptResult{}, refused("%v", err)
	}
	if o.Roots == nil {
		return ReceiptResult{}, ErrNoCA
	}
	if _, err := takedown.Verify(s, o.Roots, o.now()); err != nil {
		return ReceiptResult{}, refused("%v", err)
	}
	r := s.Receipt
	if r.Node != node {
		return ReceiptResult{}, refused("the receipt is node %q's, and the caller is %q: a node posts only its own receipts", r.Node, node)
	}
	raw, ok, err := o.getTarget(ctx, OrdersTarget(node), orderReqPfx+r.Request)
	if err != nil {
		return ReceiptResult{}, err
	}
	if !ok {
		return ReceiptResult{}, refused("no order for request %q to node %q", r.Request, node)
	}
	var ord Order
	if err := json.Unmarshal(raw, &ord); err != nil {
		return ReceiptResult{}, fmt.Errorf("%w: order %s of %s: %v", relaycore.ErrCorruptRecord, r.Request, node, err)
	}
	switch {
	case r.ContentID != ord.ContentID:
		return ReceiptResult{}, refused("content %q is not the order's %q", r.ContentID, ord.ContentID)
	case r.SHA256 != ord.SHA256:
		return ReceiptResult{}, refused("digest %s is not the one the holder index had for node %q (%s)", r.SHA256, node, ord.SHA256)
	case r.EvictedAt.Before(time.UnixMilli(ord.RequestedMS).Add(-takedown.MaxClockSkew)):
		return ReceiptResult{}, refused("evicted_at %s is before the request (%s, allowing %v of clock skew)",
			r.EvictedAt.Format(time.RFC3339Nano), time.UnixMilli(ord.RequestedMS).UTC().Format(time.RFC3339Nano), takedown.MaxClockSkew)
	}
	ids, err := o.takedownsOf(ctx, node, r.Request, ord.Takedown)
	if err != nil {
		return ReceiptResult{}, err
	}
	res := ReceiptResult{Request: r.Request, Takedown: ord.Takedown}
	var rows []relaycore.Row
	same := 0
	for _, id := range ids {
		target := TakedownTarget(id)
		prev, ok, err := o.getTarget(ctx, target, receiptPfx+r.Request)
		switch {
		case err != nil:
			return ReceiptResult{}, err
		case ok && bytes.Equal(prev, line):
			same++
		case ok:
			// It holds another receipt for the request: it keeps it.
		default:
			rows = append(rows, relaycore.Row{Target: target, Puts: []relaycore.KV{{Key: receiptPfx + r.Request, Value: bytes.Clone(line)}}})
		}
	}
	if len(rows) == 0 {
		if same == 0 {
			return ReceiptResult{}, refused("another receipt for request %q was accepted already", r.Request)
		}
		res.Replayed = true
		return res, nil
	}
	key := []string{string(line)}
	for _, row := range rows {
		key = append(key, string(row.Target))
	}
	cr, err := o.enqueue(ctx, ControlSource, idemKey("r", key...), rows)
	if err != nil {
		return ReceiptResult{}, err
	}
	res.Replayed = cr.Replayed
	if !res.Replayed {
		o.log().Info("takedown receipt accepted", "takedown", ord.Takedown, "node", node, "request", r.Request,
			"content_id", r.ContentID, "sha256", r.SHA256, "evicted_at", r.EvictedAt.Format(time.RFC3339Nano))
	}
	return res, nil
}

// getTarget reads one key of a target partition with a one-item scan
// rather than a Get: the api function's role may only page through the
// target table (template.yaml: producers read it, never write it, and
// need no other action on it).
func (o *Owner) getTarget(ctx context.Context, target relaycore.Partition, key string) ([]byte, bool, error) {
	pg, err := relaycore.ReadTarget(ctx, o.Relay.Target, target, relaycore.TargetReadRequest{Prefix: key, Limit: 1})
	if err != nil {
		return nil, false, err
	}
	if len(pg.Items) == 0 || pg.Items[0].Key != key {
		return nil, false, nil
	}
	return pg.Items[0].Value, true, nil
}

// takedownsOf lists the takedowns the order of request answers (its
// "t/<request>/<id>" marks in node's order partition), first the order's
// own.
func (o *Owner) takedownsOf(ctx context.Context, node, request, first string) ([]string, error) {
	pfx := orderForPfx + request + "/"
	items, err := o.readAll(ctx, OrdersTarget(node), pfx)
	if err != nil {
		return nil, err
	}
	ids := []string{first}
	for _, it := range items {
		if id := strings.TrimPrefix(it.Key, pfx); id != first {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		if err := checkID(id); err != nil {
			return nil, fmt.Errorf("%w: order %s of %s names takedown %q", relaycore.ErrCorruptRecord, request, node, id)
		}
	}
	return ids, nil
}
