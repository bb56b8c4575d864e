// Package fire is the fire function's handler: alarms for one source.
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
// Continuation. A Scheduler kick runs at least five seconds later, often
// more, so a backlog that needs many alarms would drain at Scheduler's
// pace. When an alarm moved rows and the alarm it re-armed is already due,
// the handler also invokes the fire function again at once, asynchronously
// (Continuer), with {"source":...,"hop":N+1}. The durable alarm and the
// Scheduler kick stay as they are: the continuation is best effort, and a
// duplicate fire (continuation and schedule) is harmless because of the
// engine's fire claim.
//
// Draining in the invocation. A hop costs an invocation and Lambda's async
// queue delay for every alarm, and a chain ends after 1+MaxHops of them:
// a backlog bigger than that many alarms' budget then waited for a
// schedule (up to about a minute) between chains. So an invocation whose
// alarm continues runs the source's next alarm itself, for up to
// DrainSlice (and never into the last three alarms' worth of its
// deadline), and only then queues the next hop. Each alarm keeps its
// budget, its claim and its re-arm; only where the next one runs changes.
//
// The chain is bounded three ways, so a bug cannot loop forever:
//   - hops: an invocation started by a schedule, the sweep or an operator is
//     hop 0; a continuation of hop N is N+1, and hop MaxHops continues no
//     further (the schedule armed by the same alarm takes over). An event
//     with a hop outside 0..MaxContinuationHops is refused.
//   - work: only an alarm that delivered or cleaned rows continues, so a
//     chain is never longer than the rows it moves; a fire that found
//     nothing to do, a busy fire (another invocation holds the claim) and
//     an alarm that backed off (the re-armed due time is in the future)
//     never continue.
//   - Lambda: with the function's recursive loop detection on (the
//     default), Lambda itself stops a chain of about 16 invocations;
//     MaxContinuationHops keeps the chain below that.
//
// Scheduler and Lambda async invocation are at-least-once, so the same
// event may arrive twice, even concurrently. That is safe and cheap: the
// engine's fire claim (a guarded write of rs) lets one invocation work and
// makes the others step aside as Busy without calling any target, and every
// target batch is guarded by the target's watermark, so no row is applied
// twice. A busy alarm asks the Kicker (a Scheduler kick) to wake the source
// when the claim it met lapses: an invocation cut off by its timeout cannot
// re-arm, and its claim then delays the source by about ClaimTTL instead of
// until the sweep. A live holder re-arms anyway, so that kick costs one
// invocation that usually finds little to do; kicks for one claim collapse
// (one schedule name per due second).
package fire

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Alarmer runs one alarm; *relaycore.RelayHandler is one.
type Alarmer interface {
	Alarm(ctx context.Context, source relaycore.Partition) (relaycore.AlarmResult, error)
}

// Continuer starts another invocation of the fire function for source, as
// hop hop of the current chain, without waiting for it;
// *lambdainvoke.Invoker is one. An error means the continuation may not
// run; the handler logs it and relies on the Scheduler kick.
type Continuer interface {
	Continue(ctx context.Context, source relaycore.Partition, hop int) error
}

// MaxContinuationHops is the largest hop an event may carry and the
// largest MaxHops. A chain is at most 1+MaxHops invocations, which keeps
// it below the ~16 invocations after which Lambda's recursive loop
// detection stops a chain (and dead-letters its event).
const MaxContinuationHops = 14

// DefaultMaxHops is the continuation bound the template deploys
// (ContinuationHops): 13 alarms per kick, 208 targets on the free plan.
const DefaultMaxHops = 12

// Handler handles fire events. Relay is required; a nil Logger discards.
// Continue nil or MaxHops 0 turns continuation off (every re-armed alarm
// then waits for its schedule or the sweep).
type Handler struct {
	Relay  Alarmer
	Logger *slog.Logger
	// Continue continues a source whose alarm moved rows and is due again.
	Continue Continuer
	// MaxHops bounds continuations per kick (0..MaxContinuationHops).
	MaxHops int
	// DrainSlice is how long one invocation goes on running alarms for a
	// source that continues before it hands over to the next hop (0: one
	// alarm per invocation). Only with continuation on (Continue set,
	// MaxHops above 0): a chain is then 1+MaxHops slices of draining.
	DrainSlice time.Duration
	// Clock tells whether the re-armed alarm is already due; nil means
	// relaycore.SystemClock. Use the RelayHandler's clock.
	Clock relaycore.Clock
	// Metrics records each alarm's CloudWatch metrics (EMF lines); nil
	// records none. It runs after the continuation is queued, so its
	// state read does not delay the next hop.
	Metrics *metrics.Recorder
	// Takedowns, when set, runs one takedown owner pass after an alarm of
	// a takedown source (what it delivered may be the owner's next step:
	// an order after a request, a status after a receipt), so a takedown
	// does not wait for the sweep's minute.
	Takedowns *takedowns.Owner
}

// Event is the fire function's input. A schedule sends {"source":...}
// (infra/scheduler.FireInput; events/fire.json is one); a continuation
// adds "hop" (infra/lambdainvoke.Input).
type Event struct {
	Source string `json:"source"`
	// Hop is the invocation's place in a continuation chain: 0 (absent)
	// for a schedule, the sweep or an operator, N+1 for the continuation
	// of hop N. At most MaxContinuationHops.
	Hop int `json:"hop,omitempty"`
}

// Result is the handler's response: what the alarm did. Async invocations
// discard it; it is there for `sam local invoke`, tests and logs.
type Result struct {
	Source string `json:"source"`
	// Fires run by the invocation's alarms; Busy means another invocation
	// held the source's claim and this one's last alarm stepped aside
	// without delivering.
	Fires int  `json:"fires"`
	Busy  bool `json:"busy,omitempty"`
	// RowsDelivered are the rows the alarm's fires recorded as delivered
	// (each delivered row counted once, by the fire that records it; see
	// relaycore.FireResult); RowsCleaned left the outbox; TargetCalls are
	// target batches sent.
	RowsDelivered int `json:"rows_delivered"`
	RowsCleaned   int `json:"rows_cleaned"`
	TargetCalls   int `json:"target_calls"`
	TargetsBlock  int `json:"targets_blocked,omitempty"`
	// Cleared: the outbox is empty and the alarm record was deleted.
	// Otherwise NextDueMS is the re-armed alarm's due time (0 when Busy).
	Cleared   bool  `json:"cleared,omitempty"`
	NextDueMS int64 `json:"next_due_ms,omitempty"`
	// Alarms is how many alarms the invocation ran (DrainSlice); the
	// figures above are their sums, Busy, TargetsBlock, Cleared and
	// NextDueMS the last one's.
	Alarms int `json:"alarms"`
	// Hop is the event's hop; Continued means this invocation queued the
	// next hop (an async invoke Lambda accepted).
	Hop       int  `json:"hop,omitempty"`
	Continued bool `json:"continued,omitempty"`
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
	if ev.Hop < 0 || ev.Hop > MaxContinuationHops {
		return ev, "", &event.InvalidEventError{Function: "fire", Reason: fmt.Sprintf("hop %d outside 0..%d", ev.Hop, MaxContinuationHops)}
	}
	return ev, src, nil
}

// ShouldContinue is the continuation rule: the alarm's last fire made
// progress (the engine's AlarmResult.Progress: rows delivered or cleaned,
// or the cursor moved past blocked rows), the alarm was re-armed rather
// than cleared or skipped as busy, and the re-armed alarm is due at nowMS.
// The engine re-arms due "now" after progress and with back-off after none,
// so a backed-off alarm never continues.
func ShouldContinue(ar relaycore.AlarmResult, nowMS int64) bool {
	return ar.Progress && !ar.Busy && !ar.Cleared && ar.NextDueMS > 0 && ar.NextDueMS <= nowMS
}

// Handle runs one alarm for the event's source. An invalid event is
// refused with an *event.InvalidEventError before anything is read. A
// storage error is returned as is: Lambda retries the async invocation
// and, failing that, dead-letters it; the durable alarm record stays, so
// the sweep fires the source again either way.
func (h *Handler) Handle(ctx context.Context, payload json.RawMessage) (Result, error) {
	ev, src, err := ParseEvent(payload)
	log := event.Logger(ctx, h.Logger)
	if err != nil {
		log.Warn("fire event refused", "err", err)
		return Result{}, err
	}
	res := Result{Source: string(src), Hop: ev.Hop}
	clk := h.clock()
	start := clk.Now()
	var longest time.Duration
	for {
		began := clk.Now()
		ar, err := h.Relay.Alarm(ctx, src)
		res.add(ar)
		alog := log.With("source", string(src), "hop", ev.Hop, "alarm", res.Alarms, "fires", ar.Fires, "busy", ar.Busy,
			"rows_delivered", ar.RowsDelivered, "target_calls", ar.TargetCalls,
			"cleared", ar.Cleared, "next_due_ms", ar.NextDueMS)
		if err != nil {
			alog.Error("relay alarm failed; the durable alarm stays for a retry or the sweep", "err", err)
			h.Metrics.Alarm(ctx, metrics.AlarmOutcome{Source: src, Result: ar, Err: err})
			return res, err
		}
		now := clk.Now()
		longest = max(longest, now.Sub(began))
		more := h.Continue != nil && h.MaxHops > 0 && ShouldContinue(ar, now.UnixMilli())
		drain := more && h.drainOn(ctx, now, start, longest)
		if more && !drain && ev.Hop < min(h.MaxHops, MaxContinuationHops) {
			if cerr := h.Continue.Continue(ctx, src, ev.Hop+1); cerr != nil {
				alog.Warn("relay continuation failed; the alarm's schedule or the sweep continues the source", "err", cerr)
			} else {
				res.Continued = true
			}
		}
		alog.Info("relay alarm done", "continued", res.Continued, "drains_on", drain)
		h.Metrics.Alarm(ctx, metrics.AlarmOutcome{Source: src, Result: ar})
		h.takedownPass(ctx, alog, src, ar)
		if !drain {
			return res, nil
		}
	}
}

// add adds alarm ar's figures to r; r's outcome (busy, blocked, cleared,
// next due) becomes ar's, the invocation's last alarm.
func (r *Result) add(ar relaycore.AlarmResult) {
	r.Alarms++
	r.Fires += ar.Fires
	r.RowsDelivered += ar.RowsDelivered
	r.RowsCleaned += ar.RowsCleaned
	r.TargetCalls += ar.TargetCalls
	r.Busy, r.TargetsBlock, r.Cleared, r.NextDueMS = ar.Busy, ar.TargetsBlock, ar.Cleared, ar.NextDueMS
}

// drainOn reports whether the invocation runs its source's next alarm
// itself, at now, having started at start and taken longest for its
// longest alarm: while it has run less than DrainSlice, and with three
// times its longest alarm left before the function's deadline. A hop costs
// an invocation and Lambda's async queue delay (tens to hundreds of
// milliseconds) per alarm; an alarm in the same invocation costs neither,
// and a chain of 1+MaxHops invocations drains for as many slices before
// it waits for a schedule, instead of for 1+MaxHops alarms.
func (h *Handler) drainOn(ctx context.Context, now, start time.Time, longest time.Duration) bool {
	if now.Sub(start) >= h.DrainSlice {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && dl.Sub(now) < 3*longest {
		return false
	}
	return true
}

// takedownPass runs one takedown owner pass after an alarm of a takedown
// source that delivered rows.
func (h *Handler) takedownPass(ctx context.Context, log *slog.Logger, src relaycore.Partition, ar relaycore.AlarmResult) {
	if h.Takedowns == nil || !takedowns.Reserved(string(src)) || ar.RowsDelivered == 0 {
		return
	}
	r, err := h.Takedowns.Run(ctx)
	if err != nil {
		log.Warn("takedown owner: pass after the alarm failed; the sweep's pass starts over", "err", err)
	} else {
		log.Info("takedown owner: pass", "ordered", r.Ordered, "late_requests", r.LateRequests, "pending", r.Pending, "overdue", r.Overdue)
	}
}

func (h *Handler) clock() relaycore.Clock {
	if h.Clock == nil {
		return relaycore.SystemClock{}
	}
	return h.Clock
}
