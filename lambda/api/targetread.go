package api

import (
	"context"
	"encoding/base64"
	"log/slog"
	"strconv"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// The target read routes let an application read what relay delivered to
// its target partitions, through the same endpoint it enqueues with
// (relaycore.ReadTarget and TargetWatermarks; docs/api.md, "Reading
// target partitions").

// TargetItemsResponse answers GET /v1/targets/{target}/items.
type TargetItemsResponse struct {
	Target string `json:"target"`
	// TargetHex is the name's bytes in lowercase hex when they are not
	// valid UTF-8 (Target shows U+FFFD in their place).
	TargetHex string `json:"target_hex,omitempty"`
	// Items are the partition's application keys in key order, values in
	// standard base64 (as in the enqueue body).
	Items []TargetItem `json:"items"`
	// Next, when non-empty, is the after= of the next page; NextHex its
	// bytes in hex when they are not valid UTF-8 (send them
	// percent-encoded).
	Next    string `json:"next,omitempty"`
	NextHex string `json:"next_hex,omitempty"`
}

// TargetItem is one key of a target partition. A key a Go program wrote
// through the engine may be any bytes: KeyHex has them in lowercase hex
// when they are not valid UTF-8.
type TargetItem struct {
	Key    string `json:"key"`
	KeyHex string `json:"key_hex,omitempty"`
	Value  string `json:"value"`
}

// TargetWatermarksResponse answers GET /v1/targets/{target}/watermarks:
// for each source that delivered to the target, the last seq applied.
type TargetWatermarksResponse struct {
	Target     string                      `json:"target"`
	TargetHex  string                      `json:"target_hex,omitempty"`
	Watermarks []relaycore.SourceWatermark `json:"watermarks"`
}

// targetStore is the store the target partitions live in.
func (h *Handler) targetStore() (relaycore.Store, error) {
	switch {
	case h.Target != nil:
		return h.Target, nil
	case h.Relay != nil && h.Relay.Target != nil:
		return h.Relay.Target, nil
	}
	return nil, fail(500, "internal", "target reads are not configured on this endpoint")
}

// reservedTarget refuses reading the takedown partitions through the
// target reads: the holder index, orders and receipts are read through the
// takedown routes, by the roles those need (a node reads only its own
// orders).
func reservedTarget(t relaycore.Partition) *apiError {
	if takedowns.Reserved(string(t)) {
		return fail(403, "forbidden", "target %q is the takedown owner's: read it through the takedown routes (docs/takedown.md)", t)
	}
	return nil
}

func (h *Handler) targetItems(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	if e := reservedTarget(m.target); e != nil {
		return nil, e
	}
	q, e := query(req, "prefix", "after", "limit")
	if e != nil {
		return nil, e
	}
	r := relaycore.TargetReadRequest{Prefix: q["prefix"], After: q["after"], Limit: relaycore.DefaultTargetReadLimit}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, fail(400, "bad_request", "limit %q: want 1..1000", v)
		}
		r.Limit = n
	}
	// Base64 takes 4/3 of a value and JSON may escape a key: half the
	// export budget in raw bytes keeps the body within it.
	r.MaxBytes = h.maxExportBytes() / 2
	st, err := h.targetStore()
	if err != nil {
		return nil, err
	}
	pg, err := relaycore.ReadTarget(ctx, st, m.target, r)
	if err != nil {
		return nil, err
	}
	out := TargetItemsResponse{Target: string(m.target), TargetHex: relaycore.TargetNameHex(m.target),
		Items: make([]TargetItem, len(pg.Items)), Next: pg.Next, NextHex: relaycore.TargetNameHex(relaycore.Partition(pg.Next))}
	for i, kv := range pg.Items {
		out.Items[i] = TargetItem{Key: kv.Key, KeyHex: relaycore.TargetNameHex(relaycore.Partition(kv.Key)), // the same rule for a key's bytes
			Value: base64.StdEncoding.EncodeToString(kv.Value)}
	}
	return out, nil
}

func (h *Handler) targetWatermarks(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	if e := reservedTarget(m.target); e != nil {
		return nil, e
	}
	if _, e := query(req); e != nil {
		return nil, e
	}
	st, err := h.targetStore()
	if err != nil {
		return nil, err
	}
	wm, err := relaycore.TargetWatermarks(ctx, st, m.target)
	if err != nil {
		return nil, err
	}
	return TargetWatermarksResponse{Target: string(m.target), TargetHex: relaycore.TargetNameHex(m.target), Watermarks: wm}, nil
}
