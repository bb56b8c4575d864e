// Package fire is the fire function's handler: one alarm for one source.
//
// An alarm schedule (or a re-arm, or the sweep's re-kick) invokes the
// function with {"source":"<id>"}. The handler runs
// relaycore.RelayHandler.Alarm: up to the plan's fires per alarm, each
// claiming the source, delivering to up to the plan's targets and
// checkpointing. When rows remain, Alarm re-arms the durable alarm record
// (due now after progress, after a back-off when a fire delivered
// nothing) and kicks the scheduler, which arms the next invocation; when
// the outbox is empty it deletes the alarm record.
//
// Scheduler and Lambda async invocation are at-least-once, so the same
// event may arrive twice, even concurrently. That is safe and cheap: the
// engine's fire claim (a guarded write of rs) lets one invocation work and
// makes the others step aside as Busy without calling any target, and every
// target batch is guarded by the target's watermark, so no row is applied
// twice.
package fire

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
)

// Alarmer runs one alarm; *relaycore.RelayHandler is one.
type Alarmer interface {
	Alarm(ctx context.Context, source relaycore.Partition) (relaycore.AlarmResult, error)
}

// Handler handles fire events. Relay is required; a nil Logger discards.
type Handler struct {
	Relay  Alarmer
	Logger *slog.Logger
}

// Event is the fire function's input. It is exactly what an alarm
// schedule sends (infra/scheduler.FireInput); events/fire.json is one.
type Event struct {
	Source string `json:"source"`
}

// Result is the handler's response: what the alarm did. Async invocations
// discard it; it is there for `sam local invoke`, tests and logs.
type Result struct {
	Source string `json:"source"`
	// Fires run by this alarm; Busy means another invocation held the
	// source's claim and this one stepped aside without delivering.
	Fires int  `json:"fires"`
	Busy  bool `json:"busy,omitempty"`
	// RowsDelivered were newly applied at targets; RowsCleaned left the
	// outbox; TargetCalls are target batches sent.
	RowsDelivered int `json:"rows_delivered"`
	RowsCleaned   int `json:"rows_cleaned"`
	TargetCalls   int `json:"target_calls"`
	TargetsBlock  int `json:"targets_blocked,omitempty"`
	// Cleared: the outbox is empty and the alarm record was deleted.
	// Otherwise NextDueMS is the re-armed alarm's due time (0 when Busy).
	Cleared   bool  `json:"cleared,omitempty"`
	NextDueMS int64 `json:"next_due_ms,omitempty"`
}

// ParseEvent decodes and validates a fire event.
func ParseEvent(payload []byte) (Event, relaycore.Partition, error) {
	var ev Event
	if err := event.DecodeStrict("fire", payload, &ev); err != nil {
		return ev, "", err
	}
	src, err := event.Source("source", ev.Source)
	if err != nil {
		return ev, "", &event.InvalidEventError{Function: "fire", Reason: err.Error()}
	}
	return ev, src, nil
}

// Handle runs one alarm for the event's source. An invalid event is
// refused with an *event.InvalidEventError before anything is read. A
// storage error is returned as is: Lambda retries the async invocation
// and, failing that, dead-letters it; the durable alarm record stays, so
// the sweep fires the source again either way.
func (h *Handler) Handle(ctx context.Context, payload json.RawMessage) (Result, error) {
	_, src, err := ParseEvent(payload)
	log := event.Logger(ctx, h.Logger)
	if err != nil {
		log.Warn("fire event refused", "err", err)
		return Result{}, err
	}
	ar, err := h.Relay.Alarm(ctx, src)
	res := Result{
		Source: string(src), Fires: ar.Fires, Busy: ar.Busy,
		RowsDelivered: ar.RowsDelivered, RowsCleaned: ar.RowsCleaned,
		TargetCalls: ar.TargetCalls, TargetsBlock: ar.TargetsBlock,
		Cleared: ar.Cleared, NextDueMS: ar.NextDueMS,
	}
	log = log.With("source", string(src), "fires", res.Fires, "busy", res.Busy,
		"rows_delivered", res.RowsDelivered, "target_calls", res.TargetCalls,
		"cleared", res.Cleared, "next_due_ms", res.NextDueMS)
	if err != nil {
		log.Error("relay alarm failed; the durable alarm stays for a retry or the sweep", "err", err)
		return res, err
	}
	log.Info("relay alarm done")
	return res, nil
}
