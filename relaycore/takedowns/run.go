package takedowns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// RunResult sums up one owner pass.
type RunResult struct {
	// Open counts the takedowns watched; Complete those complete now.
	Open, Complete int
	// Waiting counts takedowns skipped this pass because rows the control
	// source took for them are not delivered yet (the next pass acts).
	Waiting int
	// Ordered counts orders written, LateRequests requests for late
	// holders.
	Ordered, LateRequests int
	// Closed counts complete takedowns taken off the open list.
	Closed int
	// Pending and Overdue count holders without a receipt or waiver, and
	// those whose timer passed: reported, never dropped (their orders
	// stay, and the next pass counts them again).
	Pending, Overdue int
}

// Run is one pass of the owner over the open takedowns. For each, once the
// control source has delivered everything it took for it (so nothing the
// owner wrote is still on its way):
//   - every handoff without an order becomes one: an order in the holder's
//     order partition and the "ordered" mark in the takedown, in one
//     idempotent enqueue (a crash between steps, or two owners at once,
//     write it once);
//   - every late holder gets a request of its own: a node the index says
//     holds the content with no request yet, or one whose last report of
//     holding it (its own clock) is later than the eviction it proved;
//   - holders past their handoff's timer are counted overdue and logged.
//
// Run reads and writes nothing else; an error stops the pass (the next
// one starts over, and every step is idempotent).
func (o *Owner) Run(ctx context.Context) (RunResult, error) {
	var res RunResult
	open, err := o.readAll(ctx, OpenTarget, "")
	if err != nil {
		return res, err
	}
	var errs []error
	for _, it := range open {
		if err := o.runOne(ctx, it.Key, &res); err != nil {
			errs = append(errs, fmt.Errorf("takedown %s: %w", it.Key, err))
		}
	}
	return res, errors.Join(errs...)
}

func (o *Owner) runOne(ctx context.Context, id string, res *RunResult) error {
	res.Open++
	target := TakedownTarget(id)
	ready, err := o.caughtUp(ctx, target)
	if err != nil {
		return err
	}
	v, err := o.load(ctx, id)
	if errors.Is(err, ErrNotYet) {
		// The open entry commits before the record, in one batch or the
		// one before it: the record is on its way.
		res.Waiting++
		return nil
	}
	if errors.Is(err, ErrNotFound) {
		// Everything the control source took for the takedown is
		// delivered and there is no record: the request's commits were
		// cut short after the open entry (its answer was an error). Not a
		// takedown: off the list.
		row := relaycore.Row{Target: OpenTarget, Deletes: []string{id}}
		if _, err := o.enqueue(ctx, ControlSource, idemKey("x", id), []relaycore.Row{row}); err != nil {
			return err
		}
		o.log().Warn("takedown without a record dropped from the open list (its request failed part way)", "takedown", id)
		res.Open--
		return nil
	}
	if err != nil {
		return err
	}
	now := o.now()
	if ready {
		for _, req := range sortedKeys(v.handoffs) {
			if _, done := v.ordered[req]; done {
				continue
			}
			if err := o.order(ctx, v, v.handoffs[req].Request); err != nil {
				return err
			}
			res.Ordered++
		}
		for _, node := range sortedKeys(v.holders) {
			t, ok := v.lateRequest(node)
			if !ok {
				continue
			}
			row, err := relaycore.NewTakedownRow(target, t)
			if err != nil {
				return err
			}
			if _, err := o.enqueue(ctx, ControlSource, idemKey("q", id, requestSuffix(t)), []relaycore.Row{row}); err != nil {
				return err
			}
			o.log().Info("takedown late holder requested", "takedown", id, "node", node, "request", requestSuffix(t),
				"last_report_ms", v.holders[node].ReportedMS)
			res.LateRequests++
		}
	} else {
		res.Waiting++
	}
	st := v.status(now, o.Roots)
	if st.Complete {
		res.Complete++
		if ready && o.closeAfter() > 0 && !v.lastProof().Add(o.closeAfter()).After(now) {
			row := relaycore.Row{Target: OpenTarget, Deletes: []string{id}}
			if _, err := o.enqueue(ctx, ControlSource, idemKey("c", id), []relaycore.Row{row}); err != nil {
				return err
			}
			o.log().Info("takedown closed: complete, no longer watched", "takedown", id, "content_id", v.meta.ContentID,
				"holders", st.HoldersExpected, "receipts", st.ReceiptsVerified, "waived", st.Waived)
			res.Closed++
		}
	}
	res.Pending += st.Pending
	res.Overdue += st.Overdue
	for _, h := range st.Holders {
		if h.Overdue {
			o.log().Warn("takedown holder overdue", "takedown", id, "content_id", v.meta.ContentID, "node", h.Node,
				"request", h.Request, "timer_due_ms", h.TimerDueMS, "last_report_ms", h.LastReportMS, "ordered", h.Ordered)
		}
	}
	return nil
}

// order writes the order of request t: the node's order and the
// takedown's mark, one idempotent enqueue. The digest is the index's for
// that node (the one its receipt must name).
func (o *Owner) order(ctx context.Context, v *view, t relaycore.ContentTakedownV1) error {
	h, ok := v.holders[t.LateHolder]
	if !ok {
		// Requests come from the index; a node without an index record
		// cannot be ordered a digest. Counted pending, logged.
		o.log().Error("takedown request for a node the holder index does not know", "takedown", v.meta.ID, "node", t.LateHolder)
		return nil
	}
	req := requestSuffix(t)
	ord := Order{Request: req, ContentID: t.ContentID, SHA256: h.SHA256, Takedown: v.meta.ID, Reason: t.Reason, RequestedMS: t.RequestedMS}
	val, _ := json.Marshal(ord)
	// Two takedowns of one content can derive the same request for a
	// node (a late holder's request time is its report's): the order is
	// one, and "t/<request>/<takedown>" lists every takedown it answers,
	// so its receipt reaches each of them.
	rows := []relaycore.Row{
		{Target: OrdersTarget(t.LateHolder), Puts: []relaycore.KV{{Key: orderReqPfx + req, Value: val},
			{Key: orderForPfx + req + "/" + v.meta.ID, Value: val}}},
		{Target: TakedownTarget(v.meta.ID), Puts: []relaycore.KV{{Key: orderedPfx + req, Value: val}}},
	}
	_, err := o.enqueue(ctx, ControlSource, idemKey("o", v.meta.ID, req), rows)
	if errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
		// Ordered before, when the index had another digest: that order
		// stands.
		return nil
	}
	if err != nil {
		return err
	}
	o.log().Info("takedown order written", "takedown", v.meta.ID, "node", t.LateHolder, "request", req, "sha256", h.SHA256)
	return nil
}

// lateRequest is the request node needs now, if any: the index says it
// holds the content, no waiver saw that report, and either it has no request yet
// or its last report of holding the content (ObservedMS, its own clock)
// is later than the eviction its verified receipt proves (the content came
// back: a rebuilt edged.db, a peer's copy). The request time is derived
// from the index record, so every pass (and every owner) derives the same
// request.
func (v *view) lateRequest(node string) (relaycore.ContentTakedownV1, bool) {
	h := v.holders[node]
	if h.State != StateHeld {
		return relaycore.ContentTakedownV1{}, false
	}
	if v.saw(node) {
		// The copy the waiver released. A held report after it (a greater
		// seq) makes the node a late holder like any other.
		return relaycore.ContentTakedownV1{}, false
	}
	t := relaycore.ContentTakedownV1{Version: 1, ContentID: v.meta.ContentID, LateHolder: node, Reason: v.meta.Reason}
	last, ok := v.latest(node)
	if !ok {
		t.RequestedMS = max(v.meta.RequestedMS, h.ReportedMS)
		return t, true
	}
	line, ok := v.receipts[requestSuffix(last)]
	if !ok {
		return relaycore.ContentTakedownV1{}, false // pending: the held report is expected
	}
	at, err := verifyStoredForm(line)
	if err != nil || h.ObservedMS <= at.UnixMilli() {
		return relaycore.ContentTakedownV1{}, false
	}
	t.RequestedMS = max(h.ReportedMS, last.RequestedMS+1)
	return t, true
}

func (o *Owner) closeAfter() time.Duration {
	if o.CloseAfter == 0 {
		return DefaultCloseAfter
	}
	return o.CloseAfter
}

// lastProof is when the takedown last changed towards complete: its latest
// receipt's eviction or waiver, or its request.
func (v *view) lastProof() time.Time {
	last := time.UnixMilli(v.meta.RequestedMS)
	for _, line := range v.receipts {
		if at, err := verifyStoredForm(line); err == nil && at.After(last) {
			last = at
		}
	}
	for _, ws := range v.waivers {
		for _, w := range ws {
			if at := time.UnixMilli(w.AtMS); at.After(last) {
				last = at
			}
		}
	}
	return last
}
