// Package metrics writes the fire and sweep functions' CloudWatch metrics
// as Embedded Metric Format (EMF) log lines: one JSON object per line on
// the function's stdout, which Lambda sends to CloudWatch Logs, where the
// metrics are extracted. That needs no API call, no client and no IAM
// grant beyond the log delivery every function already has, and it adds
// nothing to an invocation's latency but one write.
//
// Every line carries the dimension Stack (the stack name: two stacks in one
// account and region may share a namespace). With PerSource set it also
// declares the dimension set [Stack, Source], so each metric exists twice:
// once per stack (the aggregate the template's alarms watch) and once per
// source. Each distinct combination of namespace, metric name and
// dimension values is a billed custom metric, so per-source metrics cost
// 11 metrics per source that fires in a month (docs/operations.md, Metrics):
// off by default, because the number of sources is unbounded. The source
// is always written as a plain property, so CloudWatch Logs Insights finds
// the source behind an aggregate figure without any metric cost.
//
// The metric names and their meaning are documented in docs/operations.md;
// TestDocumentsEveryMetric keeps that page and this package in step.
package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/relay-dev/relay/relaycore"
)

// DefaultNamespace is the CloudWatch namespace when none is configured.
const DefaultNamespace = "Relay"

// Dimension names.
const (
	DimStack  = "Stack"
	DimSource = "Source"
)

// Units (CloudWatch's StandardUnit names).
const (
	UnitCount        = "Count"
	UnitMilliseconds = "Milliseconds"
)

// Metric names written by Alarm (fire function and sweep, once per alarm).
const (
	// Alarms counts alarms run (1 per line); AlarmsBusy those that found
	// another invocation holding the source's claim; AlarmsIdle those
	// that ran but moved no row; AlarmsFailed those that returned an
	// error.
	Alarms       = "Alarms"
	AlarmsBusy   = "AlarmsBusy"
	AlarmsIdle   = "AlarmsIdle"
	AlarmsFailed = "AlarmsFailed"
	// RowsDelivered were newly applied at their targets by the alarm.
	RowsDelivered = "RowsDelivered"
	// OldestUndeliveredAge is now minus the commit time of the source's
	// oldest undelivered row, held rows included (the lag of the source's
	// watermark); 0 when nothing is undelivered (held rows of a
	// quarantined target keep it growing after the outbox is empty).
	OldestUndeliveredAge = "OldestUndeliveredAge"
	// Gauges after the alarm's last fire.
	TargetsBlocked     = "TargetsBlocked"
	TargetsQuarantined = "TargetsQuarantined"
	TargetsPaused      = "TargetsPaused"
	RowsHeld           = "RowsHeld"
	// TargetsAutoQuarantined were quarantined by this alarm for failing.
	TargetsAutoQuarantined = "TargetsAutoQuarantined"
)

// Metric names written by Sweep (once per sweep).
const (
	SweepOverdue = "SweepOverdue"
	SweepFired   = "SweepFired"
	SweepKicked  = "SweepKicked"
	SweepErrors  = "SweepErrors"
)

// Names lists every metric this package writes, for docs and tests.
var Names = []string{
	Alarms, AlarmsBusy, AlarmsIdle, AlarmsFailed, RowsDelivered, OldestUndeliveredAge,
	TargetsBlocked, TargetsQuarantined, TargetsPaused, RowsHeld, TargetsAutoQuarantined,
	SweepOverdue, SweepFired, SweepKicked, SweepErrors,
	TakedownsOpen, TakedownHoldersPending, TakedownHoldersOverdue, TakedownOrders, TakedownLateRequests, TakedownErrors,
}

// Metric is one value of a line.
type Metric struct {
	Name  string
	Unit  string
	Value int64
}

// Recorder writes metric lines. A nil *Recorder records nothing, so
// handlers take one as an optional field. Safe for concurrent use (the
// sweep runs alarms in parallel): each line is one Write.
type Recorder struct {
	// Out receives the lines (os.Stdout in Lambda). Required.
	Out io.Writer
	// Namespace is the CloudWatch namespace; "" means DefaultNamespace.
	Namespace string
	// Stack is the Stack dimension's value; "" means "relay".
	Stack string
	// PerSource adds the [Stack, Source] dimension set to alarm lines.
	PerSource bool
	// State reads a source's state after an alarm for
	// OldestUndeliveredAge (one Query); nil leaves that metric out.
	State relaycore.Store
	// Clock stamps lines and measures ages; nil is the system clock.
	Clock relaycore.Clock
	// Logger reports lines that could not be written or a failed state
	// read; nil discards.
	Logger *slog.Logger

	mu sync.Mutex
}

// AlarmOutcome is what Alarm records about one alarm.
type AlarmOutcome struct {
	Source relaycore.Partition
	Result relaycore.AlarmResult
	Err    error
}

// Alarm records one alarm's metrics. A busy or failed alarm records only
// the counters: its Hold and Blocked figures are zero, not observed. The
// age is the alarm's own LowerBoundMS (what its re-arm read), else read
// from the source's head (relaycore.SourceRelayState: one Query), unless
// the alarm cleared the outbox with nothing held (age 0) or was busy or
// failed.
func (r *Recorder) Alarm(ctx context.Context, o AlarmOutcome) {
	if r == nil {
		return
	}
	ar := o.Result
	ms := []Metric{{Alarms, UnitCount, 1}}
	switch {
	case o.Err != nil:
		ms = append(ms, Metric{AlarmsFailed, UnitCount, 1}, Metric{RowsDelivered, UnitCount, int64(ar.RowsDelivered)})
	case ar.Busy:
		ms = append(ms, Metric{AlarmsBusy, UnitCount, 1})
	default:
		idle := int64(0)
		if ar.RowsDelivered == 0 && ar.RowsCleaned == 0 {
			idle = 1
		}
		ms = append(ms,
			Metric{AlarmsIdle, UnitCount, idle},
			Metric{RowsDelivered, UnitCount, int64(ar.RowsDelivered)},
			Metric{TargetsBlocked, UnitCount, int64(ar.Blocked)},
			Metric{TargetsQuarantined, UnitCount, int64(ar.Hold.Quarantined)},
			Metric{TargetsPaused, UnitCount, int64(ar.Hold.Paused)},
			Metric{RowsHeld, UnitCount, int64(ar.Hold.HeldRows)},
			Metric{TargetsAutoQuarantined, UnitCount, int64(ar.TargetsQuarantined)},
		)
		if age, ok := r.age(ctx, o.Source, ar); ok {
			ms = append(ms, Metric{OldestUndeliveredAge, UnitMilliseconds, age})
		}
	}
	r.write(o.Source, ms)
}

func (r *Recorder) age(ctx context.Context, source relaycore.Partition, ar relaycore.AlarmResult) (int64, bool) {
	now := r.clock().Now()
	if ar.LowerBoundMS > 0 {
		// What the alarm's re-arm read (held rows included, also when it
		// cleared the outbox): no Query of its own.
		return max(0, now.UnixMilli()-ar.LowerBoundMS), true
	}
	if ar.Cleared && ar.Hold.HeldRows == 0 {
		return 0, true
	}
	if r.State == nil {
		return 0, false
	}
	st, err := relaycore.SourceRelayState(ctx, r.State, source, now)
	if err != nil {
		r.logger().Warn("metrics: read source state for the oldest undelivered age", "source", string(source), "err", err)
		return 0, false
	}
	if st.Empty {
		return 0, true
	}
	return max(0, now.UnixMilli()-st.LowerBoundMS), true
}

// SweepCounts is what Sweep records about one sweep.
type SweepCounts struct {
	// Overdue alarms confirmed by a re-read; Fired of them ran in-process
	// and Kicked were re-kicked through the scheduler.
	Overdue, Fired, Kicked int
	// Errors: re-reads, alarms and kicks that failed, plus one when the
	// sweep itself failed (it could not list the due index).
	Errors int
}

// Metric names written by Takedowns (once per takedown owner pass: the
// sweep's, and the fire function's after an alarm of a takedown source).
const (
	// TakedownsOpen counts the takedowns the owner watches;
	// TakedownHoldersPending their holders without a verified receipt or
	// waiver, TakedownHoldersOverdue those past the overdue timer (the
	// TakedownOverdueAlarm's metric).
	TakedownsOpen          = "TakedownsOpen"
	TakedownHoldersPending = "TakedownHoldersPending"
	TakedownHoldersOverdue = "TakedownHoldersOverdue"
	// TakedownOrders were written by the pass, TakedownLateRequests made
	// for late holders; TakedownErrors is 1 when the pass failed.
	TakedownOrders       = "TakedownOrders"
	TakedownLateRequests = "TakedownLateRequests"
	TakedownErrors       = "TakedownErrors"
)

// TakedownCounts is one owner pass, as Takedowns records it.
type TakedownCounts struct {
	Open, Pending, Overdue, Orders, LateRequests, Errors int
}

// Takedowns records one takedown owner pass (aggregate only).
func (r *Recorder) Takedowns(c TakedownCounts) {
	if r == nil {
		return
	}
	r.write("", []Metric{
		{TakedownsOpen, UnitCount, int64(c.Open)},
		{TakedownHoldersPending, UnitCount, int64(c.Pending)},
		{TakedownHoldersOverdue, UnitCount, int64(c.Overdue)},
		{TakedownOrders, UnitCount, int64(c.Orders)},
		{TakedownLateRequests, UnitCount, int64(c.LateRequests)},
		{TakedownErrors, UnitCount, int64(c.Errors)},
	})
}

// Sweep records one sweep's metrics (aggregate only: a sweep has no
// source).
func (r *Recorder) Sweep(c SweepCounts) {
	if r == nil {
		return
	}
	r.write("", []Metric{
		{SweepOverdue, UnitCount, int64(c.Overdue)},
		{SweepFired, UnitCount, int64(c.Fired)},
		{SweepKicked, UnitCount, int64(c.Kicked)},
		{SweepErrors, UnitCount, int64(c.Errors)},
	})
}

func (r *Recorder) write(source relaycore.Partition, ms []Metric) {
	line, err := r.Line(source, ms)
	if err == nil {
		r.mu.Lock()
		_, err = r.Out.Write(line)
		r.mu.Unlock()
	}
	if err != nil {
		r.logger().Warn("metrics: line not written", "err", err)
	}
}

// emfMetric, emfDirective and emfMeta are the EMF metadata (the "_aws"
// member), in the specification's names.
type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

type emfMeta struct {
	Timestamp         int64          `json:"Timestamp"`
	CloudWatchMetrics []emfDirective `json:"CloudWatchMetrics"`
}

// Line encodes one EMF log line (ending in a newline) for source ("" for
// none) with metrics ms. The Source dimension set is declared only with
// PerSource and a source CloudWatch accepts as a dimension value (1..1024
// printable ASCII characters, not all spaces); other sources are written
// as a property only.
func (r *Recorder) Line(source relaycore.Partition, ms []Metric) ([]byte, error) {
	ns := r.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	stack := r.Stack
	if stack == "" {
		stack = "relay"
	}
	dims := [][]string{{DimStack}}
	if r.PerSource && DimensionValueOK(string(source)) {
		dims = append(dims, []string{DimStack, DimSource})
	}
	doc := map[string]any{DimStack: stack}
	if source != "" {
		doc[DimSource] = string(source)
	}
	d := emfDirective{Namespace: ns, Dimensions: dims}
	for _, m := range ms {
		if _, dup := doc[m.Name]; dup || m.Name == "_aws" {
			return nil, fmt.Errorf("metrics: metric name %q used twice", m.Name)
		}
		d.Metrics = append(d.Metrics, emfMetric{Name: m.Name, Unit: m.Unit})
		doc[m.Name] = m.Value
	}
	doc["_aws"] = emfMeta{Timestamp: r.clock().Now().UnixMilli(), CloudWatchMetrics: []emfDirective{d}}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("metrics: encode: %w", err)
	}
	return append(b, '\n'), nil
}

// DimensionValueOK reports whether CloudWatch accepts v as a dimension
// value: 1..1024 ASCII characters, at least one of them not white space,
// no control characters.
func DimensionValueOK(v string) bool {
	if v == "" || len(v) > 1024 {
		return false
	}
	blank := true
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 0x7f || c < 0x20 {
			return false
		}
		if c != ' ' {
			blank = false
		}
	}
	return !blank
}

// NamespaceOK reports whether CloudWatch accepts ns as a custom namespace:
// 1..255 characters of letters, digits and . - _ / # : and space, not
// starting with "AWS/" (reserved).
func NamespaceOK(ns string) bool {
	if ns == "" || len(ns) > 255 || len(ns) >= 4 && ns[:4] == "AWS/" {
		return false
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '-', c == '_', c == '/', c == '#', c == ':', c == ' ':
		default:
			return false
		}
	}
	return true
}

func (r *Recorder) clock() relaycore.Clock {
	if r.Clock == nil {
		return relaycore.SystemClock{}
	}
	return r.Clock
}

func (r *Recorder) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}
