package api

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/relay-dev/relay/relaycore"
)

// DeliveredResponse answers GET .../delivered-through?seq=N.
type DeliveredResponse struct {
	Source string `json:"source"`
	Seq    uint64 `json:"seq"`
	// Delivered: rows 1..Seq were all committed and have left the outbox,
	// so each is applied at its target (relaycore.RelayDeliveredThrough).
	Delivered bool `json:"delivered"`
}

// WatermarkResponse answers GET .../watermark.
type WatermarkResponse struct {
	Source string `json:"source"`
	// WatermarkMS is a commit-time lower bound (unix ms) of the source's
	// undelivered rows (relaycore.RelayWatermark).
	WatermarkMS int64 `json:"watermark_ms"`
}

// StateResponse answers GET .../state (relaycore.SourceRelayState).
type StateResponse struct {
	Source           string `json:"source"`
	NextSeq          uint64 `json:"next_seq"`
	FirstUndelivered uint64 `json:"first_undelivered"`
	Empty            bool   `json:"empty"`
	LowerBoundMS     int64  `json:"lower_bound_ms"`
}

func (h *Handler) deliveredThrough(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	src := m.source
	q, e := query(req, "seq")
	if e != nil {
		return nil, e
	}
	raw, ok := q["seq"]
	if !ok {
		return nil, fail(400, "bad_request", "query parameter seq is required")
	}
	seq, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || seq == 0 {
		return nil, fail(400, "bad_request", "seq %q is not a positive integer", raw)
	}
	ok, err = relaycore.RelayDeliveredThrough(ctx, h.Source, src, seq)
	if err != nil {
		return nil, err
	}
	return DeliveredResponse{Source: string(src), Seq: seq, Delivered: ok}, nil
}

func (h *Handler) watermark(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	src := m.source
	if _, e := query(req); e != nil {
		return nil, e
	}
	wm, err := relaycore.RelayWatermark(ctx, h.Source, src, h.clock().Now())
	if err != nil {
		return nil, err
	}
	return WatermarkResponse{Source: string(src), WatermarkMS: wm}, nil
}

func (h *Handler) state(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	src := m.source
	if _, e := query(req); e != nil {
		return nil, e
	}
	s, err := relaycore.SourceRelayState(ctx, h.Source, src, h.clock().Now())
	if err != nil {
		return nil, err
	}
	return StateResponse{Source: string(src), NextSeq: s.NextSeq, FirstUndelivered: s.FirstUndelivered, Empty: s.Empty, LowerBoundMS: s.LowerBoundMS}, nil
}
