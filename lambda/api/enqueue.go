package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"reflect"

	"github.com/relay-dev/relay/internal/strictjson"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// EnqueueRequest is the body of POST /v1/sources/{id}/rows.
type EnqueueRequest struct {
	Rows []RowJSON `json:"rows"`
}

// RowJSON is one relay row: puts and deletes (disjoint keys) applied
// atomically at Target, in seq order with the source's other rows for it.
type RowJSON struct {
	Target  string    `json:"target"`
	Puts    []PutJSON `json:"puts"`
	Deletes []string  `json:"deletes"`
}

// PutJSON is one key and its value, standard base64 (padded); "" is an
// empty value. Value is required.
type PutJSON struct {
	Key   string  `json:"key"`
	Value *string `json:"value"`
}

// EnqueueResponse answers a committed enqueue.
type EnqueueResponse struct {
	Source string `json:"source"`
	// Seqs holds each input row's seq, in input order.
	Seqs []uint64 `json:"seqs"`
	// AlarmDueMS is the durable alarm's due time (unix ms) written with
	// the rows: the fire function runs for this source at or after it.
	// 0 on a replay, which writes nothing.
	AlarmDueMS int64 `json:"alarm_due_ms"`
	// Replayed means an earlier request with the same Idempotency-Key
	// header and the same rows had committed them: Seqs are that
	// request's, and this one wrote nothing.
	Replayed bool `json:"replayed,omitempty"`
}

// IdempotencyKeyHeader names the request header that makes an enqueue
// idempotent (relaycore.EnqueueOptions.IdempotencyKey). Function URLs
// deliver header names in lower case.
const IdempotencyKeyHeader = "idempotency-key"

func (h *Handler) limits() (maxBody, maxRows int) {
	maxBody, maxRows = h.MaxBodyBytes, h.MaxRows
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	if maxRows <= 0 {
		maxRows = DefaultMaxRows
	}
	return
}

// ParseRows decodes and validates an enqueue body into rows: strict JSON
// (unknown fields and trailing data refused), 1..maxRows rows, base64
// values, and valid target names. The engine validates the rest (keys,
// sizes, disjoint puts and deletes) before writing anything.
//
// Bodies of the one shape producers send (parseRowsFast's) are decoded by
// a scanner over the body's bytes; any other body, and every refused one,
// by encoding/json (parseRowsJSON), which gives every error. Both return
// the same rows for every body the scanner takes (FuzzParseRows).
func ParseRows(body []byte, maxRows int) ([]relaycore.Row, error) {
	if rows, ok := parseRowsFast(body, maxRows); ok {
		return rows, nil
	}
	return parseRowsJSON(body, maxRows)
}

// parseRowsJSON is ParseRows by encoding/json: every body, every error.
func parseRowsJSON(body []byte, maxRows int) ([]relaycore.Row, error) {
	var in EnqueueRequest
	if err := strictjson.Check(body, &in); err != nil {
		return nil, fail(400, "bad_request", "body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fail(400, "bad_request", "body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fail(400, "bad_request", "body: trailing data after the JSON object")
	}
	switch {
	case in.Rows == nil:
		return nil, fail(400, "bad_request", "body: rows is required")
	case len(in.Rows) == 0:
		return nil, fail(400, "bad_request", "body: rows is empty")
	case len(in.Rows) > maxRows:
		return nil, fail(413, "too_large", "body: %d rows, limit %d per request", len(in.Rows), maxRows)
	}
	rows := make([]relaycore.Row, len(in.Rows))
	for i, r := range in.Rows {
		bad := func(format string, args ...any) error {
			e := fail(400, "invalid_row", "rows[%d]: %s", i, fmt.Sprintf(format, args...))
			e.row = &i
			return e
		}
		t, err := event.Target("target", r.Target)
		if err != nil {
			return nil, bad("%v", err)
		}
		rows[i].Target = t
		for j, p := range r.Puts {
			if p.Value == nil {
				return nil, bad("puts[%d].value is required (base64; \"\" for an empty value)", j)
			}
			v, err := base64.StdEncoding.Strict().DecodeString(*p.Value)
			if err != nil {
				return nil, bad("puts[%d].value is not standard base64: %v", j, err)
			}
			rows[i].Puts = append(rows[i].Puts, relaycore.KV{Key: p.Key, Value: v})
		}
		rows[i].Deletes = r.Deletes
	}
	return rows, nil
}

func (h *Handler) enqueue(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	src := m.source
	_, maxRows := h.limits()
	if _, e := query(req); e != nil {
		return nil, e
	}
	if e := jsonContent(req); e != nil {
		return nil, e
	}
	body := req.Body
	var opts relaycore.EnqueueOptions
	if key, ok := req.Headers[IdempotencyKeyHeader]; ok {
		// Function URLs join a repeated header with commas, which no key
		// contains, so a request with two keys is refused here too.
		if err := relaycore.ValidIdempotencyKey(key); err != nil {
			return nil, fail(400, "bad_request", "header Idempotency-Key: %v", err)
		}
		opts.IdempotencyKey = key
	}
	rows, err := ParseRows(body, maxRows)
	if err != nil {
		return nil, err
	}
	// The takedown owner's sources and targets take only its own rows:
	// a producer's row there could forge a holder report, an order or a
	// receipt.
	if takedowns.Reserved(string(src)) {
		return nil, fail(403, "forbidden", "source %q is the takedown owner's (%s...): nodes report holdings with POST /v1/holdings", src, takedowns.Namespace)
	}
	for i, r := range rows {
		if takedowns.Reserved(string(r.Target)) {
			e := fail(400, "invalid_row", "rows[%d]: target %q is the takedown owner's (%s...); no producer may write there", i, r.Target, takedowns.Namespace)
			e.row = &i
			return nil, e
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		opts.Deadline = dl.Add(-commitMargin)
	}
	res, err := h.commit(ctx, src, rows, opts)
	if err != nil {
		return nil, enqueueError(err, res)
	}
	if res.Replayed {
		log.Info("api: idempotent replay, nothing written", "source", string(src), "rows", len(rows),
			"first_seq", res.Seqs[0], "idempotency_key", opts.IdempotencyKey)
	} else {
		log.Info("api: rows committed", "source", string(src), "rows", len(rows), "batches", res.Batches,
			"first_seq", res.Seqs[0], "alarm_due_ms", res.AlarmDueMS, "kick", res.Kick.String())
		if h.Committed != nil {
			h.Committed(src, res)
		}
	}
	return EnqueueResponse{Source: string(src), Seqs: res.Seqs, AlarmDueMS: res.AlarmDueMS, Replayed: res.Replayed}, nil
}

// legacyEnqueue reports whether enqueues and requeues go through the
// deprecated Enqueue field (set, or no Relay to take them) rather than
// Relay, which a host wires once with its clock, kicker and logger.
func (h *Handler) legacyEnqueue() bool {
	return h.Relay == nil || !reflect.ValueOf(h.Enqueue).IsZero()
}

// commit enqueues rows through Relay, or the deprecated Enqueue field.
func (h *Handler) commit(ctx context.Context, src relaycore.Partition, rows []relaycore.Row, opts relaycore.EnqueueOptions) (relaycore.CommitResult, error) {
	if !h.legacyEnqueue() {
		return h.Relay.Enqueue(ctx, src, rows, opts)
	}
	cfg := h.Enqueue
	cfg.IdempotencyKey = opts.IdempotencyKey
	//lint:ignore SA1019 the deprecated Handler.Enqueue field keeps its meaning for one release
	return relaycore.CommitRelayRows(ctx, h.Source, h.clock(), src, opts.Lease, opts.Deadline, rows, cfg)
}

// jsonContent refuses a body that is not declared application/json.
func jsonContent(req Request) *apiError {
	ct := req.Headers["content-type"]
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return fail(415, "unsupported_media_type", "content-type %q, want application/json", ct)
	}
	return nil
}
