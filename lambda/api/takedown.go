package api

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// The takedown routes (docs/takedown.md, docs/api.md): the hold role's
// (a node reports its holdings, reads its orders, posts its receipts; the
// producer set) and the takedown role's (request, status, receipts, waive,
// the holder index; the operator set). A hold caller is a node: the node
// id is its verified identity (Handler.NodeOf), never anything in the
// request.

// roles names the routes that need a role of their own, beside the
// producer/operator split: relay serve grants them to principals.
var roles = map[string]string{
	"POST /v1/holdings":                     RoleHold,
	"GET /v1/orders":                        RoleHold,
	"POST /v1/receipts":                     RoleHold,
	"POST /v1/takedowns":                    RoleTakedown,
	"GET /v1/takedowns/{takedown}":          RoleTakedown,
	"GET /v1/takedowns/{takedown}/receipts": RoleTakedown,
	"POST /v1/takedowns/{takedown}/waive":   RoleTakedown,
	"GET /v1/holdings/{content}":            RoleTakedown,
}

// Roles of Route.Role.
const (
	// RoleHold: a node reporting what it holds, reading its orders and
	// posting its receipts.
	RoleHold = "hold"
	// RoleTakedown: requesting takedowns, reading their status, receipts
	// and the holder index, waiving a holder.
	RoleTakedown = "takedown"
)

// Role is the role the route needs beside its set ("" for the routes the
// producer/operator split decides): RoleHold or RoleTakedown.
func (r Route) Role() string { return roles[r.Method+" "+r.Pattern] }

// HoldingsRequest is the body of POST /v1/holdings.
type HoldingsRequest struct {
	Reports []takedowns.Report `json:"reports"`
}

// HoldingsResponse answers POST /v1/holdings.
type HoldingsResponse struct {
	Node     string `json:"node"`
	Accepted int    `json:"accepted"`
	Replayed bool   `json:"replayed"`
}

// OrdersResponse answers GET /v1/orders.
type OrdersResponse struct {
	Node   string            `json:"node"`
	Orders []takedowns.Order `json:"orders"`
	Next   string            `json:"next"`
}

// ReceiptResponse answers POST /v1/receipts.
type ReceiptResponse struct {
	Request  string `json:"request"`
	Accepted bool   `json:"accepted"`
	Replayed bool   `json:"replayed"`
}

// TakedownRequest is the body of POST /v1/takedowns.
type TakedownRequest struct {
	ContentID string `json:"content_id"`
	Reason    string `json:"reason"`
}

// TakedownResponse answers POST /v1/takedowns: the takedown's record and
// the holders requested at once (the owner requests later ones itself).
type TakedownResponse struct {
	takedowns.Takedown
	Holders []string `json:"holders"`
	// Replayed: an earlier request by the caller with the same
	// Idempotency-Key header, content and reason opened this takedown, and
	// this one wrote nothing.
	Replayed bool `json:"replayed,omitempty"`
}

// WaiveRequest is the body of POST /v1/takedowns/{id}/waive.
type WaiveRequest struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// WaiveResponse answers a waiver.
type WaiveResponse struct {
	Takedown string           `json:"takedown"`
	Node     string           `json:"node"`
	Waiver   takedowns.Waiver `json:"waiver"`
}

// HoldersResponse answers GET /v1/holdings/{content}.
type HoldersResponse struct {
	ContentID string             `json:"content_id"`
	Holders   []takedowns.Holder `json:"holders"`
}

// rawBody is a route's answer that is not JSON (the receipt file).
type rawBody struct {
	contentType string
	data        []byte
}

// ReceiptFileType is the content type of GET /v1/takedowns/{id}/receipts.
const ReceiptFileType = "application/jsonl"

var takedownAnswers = []answer{
	{takedowns.ErrInvalid, 400, "bad_request", "%v"},
	{takedowns.ErrRefused, 422, "receipt_refused", "%v; nothing was changed"},
	{takedowns.ErrNotFound, 404, "unknown_takedown", "%v"},
	{takedowns.ErrNotYet, 503, "takedown_pending", "%v; retry in a moment"},
	{takedowns.ErrNotHolder, 422, "not_a_holder", "%v"},
	{takedowns.ErrWaived, 409, "already_waived", "%v"},
	{takedowns.ErrNoCA, 500, "not_configured", "%v"},
	{relaycore.ErrIdempotencyKeyReused, 409, "idempotency_key_reused", "%v: the Idempotency-Key was used for other reports; use a new key for new reports"},
	{relaycore.ErrIdempotentRequestTooLarge, 413, "too_large", "%v; send fewer reports per request"},
	{relaycore.ErrContention, 503, "unavailable", "%v; nothing was committed, retry"},
	{relaycore.ErrDeadlineExceeded, 503, "unavailable", "%v; nothing was committed, retry"},
	{relaycore.ErrCommitUnknown, 503, "commit_unknown", "%v; retry: every write of these routes is idempotent"},
}

func takedownError(err error) error {
	if e, ok := errors.AsType[*apiError](err); ok {
		return e
	}
	if e := answerFor(takedownAnswers, err); e != nil {
		return e
	}
	return err
}

// owner is the handler's takedown owner, or the refusal when it has none.
func (h *Handler) owner() (*takedowns.Owner, error) {
	if h.Takedowns == nil {
		return nil, fail(500, "not_configured", "the takedown routes are not configured on this endpoint")
	}
	return h.Takedowns, nil
}

// node is the hold caller's node id: NodeOf's answer for the verified
// caller, or the caller's name itself without NodeOf (relay serve: a
// principal's name is its certificate's node id).
func (h *Handler) node(req Request) (string, error) {
	node, ok := req.Caller, true
	if h.NodeOf != nil {
		node, ok = h.NodeOf(req.Caller)
	}
	if !ok {
		return "", fail(403, "forbidden", "caller %q is not mapped to a node (the hold routes need one)", req.Caller)
	}
	if err := takedowns.CheckNode(node); err != nil {
		return "", fail(403, "forbidden", "caller %q cannot be a node: %v", node, err)
	}
	return node, nil
}

// validHoldingsKey is the contract's Idempotency-Key rule for holdings:
// 1..128 bytes of [A-Za-z0-9._:/-].
func validHoldingsKey(k string) bool {
	if k == "" || len(k) > 128 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '/' || c == '-') {
			return false
		}
	}
	return true
}

func (h *Handler) postHoldings(ctx context.Context, _ matched, req Request, log *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	node, err := h.node(req)
	if err != nil {
		return nil, err
	}
	key, ok := req.Headers[IdempotencyKeyHeader]
	if !ok || !validHoldingsKey(key) {
		return nil, fail(400, "bad_request", "header Idempotency-Key is required: 1..128 bytes of [A-Za-z0-9._:/-]")
	}
	var in HoldingsRequest
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	if in.Reports == nil {
		return nil, fail(400, "bad_request", "body: reports is required")
	}
	res, err := o.Report(ctx, node, key, in.Reports)
	if err != nil {
		return nil, takedownError(err)
	}
	log.Info("api: holdings reported", "node", node, "reports", res.Accepted, "replayed", res.Replayed, "idempotency_key", key)
	return HoldingsResponse{Node: node, Accepted: res.Accepted, Replayed: res.Replayed}, nil
}

func (h *Handler) getOrders(ctx context.Context, _ matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	node, err := h.node(req)
	if err != nil {
		return nil, err
	}
	q, e := query(req, "after", "limit")
	if e != nil {
		return nil, e
	}
	limit := 100
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > takedowns.MaxOrdersPage {
			return nil, fail(400, "bad_request", "limit %q: want 1..%d", v, takedowns.MaxOrdersPage)
		}
		limit = n
	}
	orders, next, err := o.Orders(ctx, node, q["after"], limit)
	if err != nil {
		return nil, takedownError(err)
	}
	return OrdersResponse{Node: node, Orders: orders, Next: next}, nil
}

func (h *Handler) postReceipt(ctx context.Context, _ matched, req Request, log *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	node, err := h.node(req)
	if err != nil {
		return nil, err
	}
	if _, e := query(req); e != nil {
		return nil, e
	}
	if e := jsonContent(req); e != nil {
		return nil, e
	}
	res, err := o.Receipt(ctx, node, req.Body)
	if err != nil {
		if errors.Is(err, takedowns.ErrRefused) {
			log.Warn("api: takedown receipt refused", "node", node, "err", err)
		}
		return nil, takedownError(err)
	}
	return ReceiptResponse{Request: res.Request, Accepted: true, Replayed: res.Replayed}, nil
}

func (h *Handler) postTakedown(ctx context.Context, _ matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	var in TakedownRequest
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	key, keyed := req.Headers[IdempotencyKeyHeader]
	if keyed {
		if err := relaycore.ValidIdempotencyKey(key); err != nil {
			return nil, fail(400, "bad_request", "header %s: %v", IdempotencyKeyHeader, err)
		}
	}
	op, err := o.Request(ctx, in.ContentID, in.Reason, actorOf(req.Caller), takedowns.RequestOptions{IdempotencyKey: key})
	switch {
	case errors.Is(err, relaycore.ErrIdempotencyKeyReused):
		return nil, fail(409, "idempotency_key_reused", "%v; use a new key for a new takedown", err)
	case errors.Is(err, relaycore.ErrCommitUnknown) && !keyed:
		return nil, fail(503, "commit_unknown", "%v; a retry may open a second takedown of the content: send an Idempotency-Key to make retries safe", err)
	case err != nil:
		return nil, takedownError(err)
	}
	return TakedownResponse{Takedown: op.Takedown, Holders: op.Holders, Replayed: op.Replayed}, nil
}

func (h *Handler) getTakedown(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	if _, e := query(req); e != nil {
		return nil, e
	}
	st, err := o.Status(ctx, m.takedown)
	if err != nil {
		return nil, takedownError(err)
	}
	return st, nil
}

func (h *Handler) getTakedownReceipts(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	if _, e := query(req); e != nil {
		return nil, e
	}
	file, err := o.Receipts(ctx, m.takedown)
	if err != nil {
		return nil, takedownError(err)
	}
	return rawBody{contentType: ReceiptFileType, data: file}, nil
}

func (h *Handler) postWaive(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	var in WaiveRequest
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	w, err := o.Waive(ctx, m.takedown, in.Node, in.Reason, actorOf(req.Caller))
	if err != nil {
		return nil, takedownError(err)
	}
	return WaiveResponse{Takedown: m.takedown, Node: in.Node, Waiver: w}, nil
}

func (h *Handler) getHolders(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	o, err := h.owner()
	if err != nil {
		return nil, err
	}
	if _, e := query(req); e != nil {
		return nil, e
	}
	hs, err := o.Holders(ctx, m.content)
	if err != nil {
		return nil, takedownError(err)
	}
	return HoldersResponse{ContentID: m.content, Holders: hs}, nil
}
