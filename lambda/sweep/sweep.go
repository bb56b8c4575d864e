// Package sweep is the sweep function's handler: the safety net that
// holds RELAY_LAG_BOUND_MS when a fast-path kick is lost (docs/engine.md, "Wake-ups: three layers",
// layer 3).
//
// Every minute (template.yaml: ScheduleV2 rate(1 minute)) the handler
// lists overdue durable alarm records through the source table's due
// index (relaycore.DueIndex; a sparse GSI query, never a table scan),
// oldest first, and re-reads each record, since index entries are hints.
//
// What it does with them, and why:
//   - The oldest FireLimit overdue alarms are fired in-process (Alarm, at
//     most Parallel at once), not re-kicked. A re-kick would go through
//     Scheduler again, whose at() schedules run up to a minute late, and a
//     lost kick plus a late re-kick would break the 60 s bound. Firing
//     here costs no extra Lambda invocation or Scheduler call.
//   - Overdue alarms beyond FireLimit, and any the handler has no time
//     left to fire, are re-kicked through the scheduler (their schedule
//     names collapse with the original kick's, so a pending schedule is
//     not duplicated). Each fire re-arms its own source afterwards, so a
//     backlog spread over many sources drains in parallel on the fast path.
//   - Nothing beyond FireLimit+KickLimit is touched; the next sweep sees
//     the rest. That bounds one invocation's work and duration.
//
// Overdue means due <= now, with no grace period: an alarm whose kick is
// merely pending may be fired here and then again by its schedule. That
// is safe (the fire claim and rh guards) and cheap (the second fire finds
// nothing), and it is what keeps the bound.
package sweep

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Defaults for Handler's limits.
const (
	// DefaultFireLimit alarms are fired in-process per sweep. A Paid alarm
	// makes at most 512 target calls; 16 of them, 4 at a time, fit the
	// function's 50 s timeout with room to spare at DynamoDB latencies.
	DefaultFireLimit = 16
	// DefaultKickLimit alarms beyond the fire limit are re-kicked per sweep.
	DefaultKickLimit = 256
	// DefaultParallel alarms run at once.
	DefaultParallel = 4
	// DefaultReserve is the time before the invocation's deadline after
	// which no further alarm is started in-process (the rest are
	// re-kicked). It matches the engine's default claim TTL: an alarm
	// cut off by the Lambda timeout leaves its claim for that long.
	DefaultReserve = 30 * time.Second
)

// Alarmer runs one alarm; *relaycore.RelayHandler is one.
type Alarmer interface {
	Alarm(ctx context.Context, source relaycore.Partition) (relaycore.AlarmResult, error)
}

// Handler handles sweep events. Relay, Index, Source and Kicker are
// required; zero limits take the defaults above; a nil Clock is the
// system clock and a nil Logger discards.
type Handler struct {
	Relay  Alarmer
	Index  relaycore.DueIndex
	Source relaycore.Store // where alarm records are re-read
	Kicker relaycore.Kicker
	Clock  relaycore.Clock
	Logger *slog.Logger
	// Metrics records each alarm the sweep fires (as the fire function
	// does) and each sweep's counts; nil records none.
	Metrics *metrics.Recorder

	FireLimit, KickLimit, Parallel int
	Reserve                        time.Duration

	// Takedowns, when set, runs one takedown owner pass after each sweep
	// (docs/takedown.md): the sweep's schedule is the owner's clock, as the
	// interval is in relay serve.
	Takedowns *takedowns.Owner
}

// Event is the sweep schedule's input (template.yaml's ScheduleV2 Input
// with Scheduler's context attributes filled in; events/sweep.json). Both
// fields are informational: the handler uses its own clock.
type Event struct {
	ScheduledTime string `json:"scheduled_time"`
	ExecutionID   string `json:"execution_id"`
}

// Result counts one sweep's work.
type Result struct {
	// Listed index entries (alarm records, at most FireLimit+KickLimit).
	Listed int `json:"listed"`
	// Stale entries: the record was gone or re-armed into the future.
	Stale int `json:"stale"`
	// Overdue alarms confirmed by the re-read (fired or kicked, or left
	// when their fire or kick failed).
	Overdue int `json:"overdue"`
	// Fired alarms ran in-process; Busy of them found another fire at work.
	Fired int `json:"fired"`
	Busy  int `json:"busy"`
	// Kicked alarms were re-armed through the scheduler instead.
	Kicked int `json:"kicked"`
	// Failed alarms or kicks returned an error (logged; the alarm record
	// stays for the next sweep).
	Failed        int `json:"failed"`
	RowsDelivered int `json:"rows_delivered"`
	// More: the index listed the limit, so more overdue alarms may wait.
	More bool `json:"more,omitempty"`
	// Takedowns is the takedown owner's pass after the sweep (nil: none).
	Takedowns *takedowns.RunResult `json:"takedowns,omitempty"`
}

// ParseEvent decodes and validates a sweep event.
func ParseEvent(payload []byte) (Event, error) {
	var ev Event
	if err := event.DecodeStrict("sweep", payload, &ev); err != nil {
		return ev, err
	}
	if ev.ScheduledTime != "" {
		if _, err := time.Parse(time.RFC3339, ev.ScheduledTime); err != nil {
			return ev, &event.InvalidEventError{Function: "sweep", Reason: fmt.Sprintf("scheduled_time %q is not an RFC 3339 time", ev.ScheduledTime)}
		}
	}
	return ev, nil
}

func (h *Handler) limits() (fire, kick, par int, reserve time.Duration) {
	fire, kick, par, reserve = h.FireLimit, h.KickLimit, h.Parallel, h.Reserve
	if fire <= 0 {
		fire = DefaultFireLimit
	}
	if kick <= 0 {
		kick = DefaultKickLimit
	}
	if par <= 0 {
		par = DefaultParallel
	}
	if reserve <= 0 {
		reserve = DefaultReserve
	}
	return
}

// overdue is one alarm record confirmed overdue by a re-read.
type overdue struct {
	source relaycore.Partition
	dueMS  int64
}

// Handle runs one sweep. It returns an error only for an invalid event or
// when the due index cannot be read; per-alarm failures are counted in
// Result and logged, and their records stay for the next sweep.
func (h *Handler) Handle(ctx context.Context, payload json.RawMessage) (Result, error) {
	log := event.Logger(ctx, h.Logger)
	ev, err := ParseEvent(payload)
	if err != nil {
		log.Warn("sweep event refused", "err", err)
		return Result{}, err
	}
	fireLimit, kickLimit, par, reserve := h.limits()
	clock := h.Clock
	if clock == nil {
		clock = relaycore.SystemClock{}
	}
	now := clock.Now().UnixMilli()
	limit := fireLimit + kickLimit
	entries, err := h.Index.Due(ctx, now, limit)
	if err != nil {
		h.Metrics.Sweep(metrics.SweepCounts{Errors: 1})
		return Result{}, fmt.Errorf("sweep: list overdue alarms: %w", err)
	}
	var res Result
	res.More = len(entries) >= limit
	seen := map[relaycore.Partition]bool{}
	var due []overdue
	for _, e := range entries {
		if e.Key != relaycore.KeyAlarm || seen[e.Partition] {
			continue
		}
		seen[e.Partition] = true
		res.Listed++
		a, ok, err := h.readAlarm(ctx, e.Partition)
		switch {
		case err != nil:
			res.Failed++
			log.Warn("sweep: re-read alarm", "source", string(e.Partition), "err", err)
		case !ok || a.DueMS > now:
			res.Stale++
		default:
			due = append(due, overdue{e.Partition, a.DueMS})
		}
	}

	res.Overdue = len(due)
	fireN := min(len(due), fireLimit)
	kickFrom := h.fireAll(ctx, due[:fireN], par, reserve, &res, log)
	for _, o := range due[kickFrom:] {
		if err := h.Kicker.Kick(ctx, o.source, o.dueMS); err != nil {
			res.Failed++
			log.Warn("sweep: re-kick failed; the next sweep retries", "source", string(o.source), "err", err)
			continue
		}
		res.Kicked++
	}
	log.Info("sweep done", "scheduled_time", ev.ScheduledTime, "execution_id", ev.ExecutionID,
		"listed", res.Listed, "stale", res.Stale, "fired", res.Fired, "busy", res.Busy,
		"kicked", res.Kicked, "failed", res.Failed, "rows_delivered", res.RowsDelivered, "more", res.More)
	h.Metrics.Sweep(metrics.SweepCounts{Overdue: res.Overdue, Fired: res.Fired, Kicked: res.Kicked, Errors: res.Failed})
	if h.Takedowns != nil {
		res.Takedowns = RunTakedowns(ctx, h.Takedowns, h.Metrics, log)
	}
	return res, nil
}

// RunTakedowns runs one takedown owner pass, logs and records it (the
// sweep's, and the fire function's after an alarm of a takedown source).
// A failed pass is logged and counted, not returned: every step of the
// owner is idempotent and the next pass starts over.
func RunTakedowns(ctx context.Context, o *takedowns.Owner, m *metrics.Recorder, log *slog.Logger) *takedowns.RunResult {
	r, err := o.Run(ctx)
	c := metrics.TakedownCounts{Open: r.Open, Pending: r.Pending, Overdue: r.Overdue, Orders: r.Ordered, LateRequests: r.LateRequests}
	if err != nil {
		c.Errors = 1
		log.Error("takedown owner: pass failed (the next pass starts over)", "err", err)
	}
	log.Info("takedown owner: pass", "open", r.Open, "complete", r.Complete, "waiting", r.Waiting,
		"ordered", r.Ordered, "late_requests", r.LateRequests, "pending", r.Pending, "overdue", r.Overdue)
	m.Takedowns(c)
	return &r
}

// fireAll runs the alarms of due in order, par at a time, and stops
// starting new ones when the invocation's deadline is within reserve. It
// returns the index of the first alarm it did not start; the caller
// re-kicks those.
func (h *Handler) fireAll(ctx context.Context, due []overdue, par int, reserve time.Duration, res *Result, log *slog.Logger) int {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, par)
	)
	started := 0
	for _, o := range due {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < reserve {
			break
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		started++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ar, err := h.Relay.Alarm(ctx, o.source)
			h.Metrics.Alarm(ctx, metrics.AlarmOutcome{Source: o.source, Result: ar, Err: err})
			mu.Lock()
			defer mu.Unlock()
			res.RowsDelivered += ar.RowsDelivered
			switch {
			case err != nil:
				res.Failed++
				log.Warn("sweep: alarm failed; the record stays for the next sweep", "source", string(o.source), "err", err)
			case ar.Busy:
				res.Busy++
				res.Fired++
			default:
				res.Fired++
			}
		}()
	}
	wg.Wait()
	return started
}

// readAlarm re-reads source's durable alarm record.
func (h *Handler) readAlarm(ctx context.Context, source relaycore.Partition) (relaycore.AlarmRecord, bool, error) {
	raw, ok, err := h.Source.Get(ctx, source, relaycore.KeyAlarm)
	if err != nil || !ok {
		return relaycore.AlarmRecord{}, ok, err
	}
	var a relaycore.AlarmRecord
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, false, fmt.Errorf("alarm %s: %w: %q", source, relaycore.ErrCorruptRecord, raw)
	}
	return a, true, nil
}
