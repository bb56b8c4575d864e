package relayserve

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relay-dev/relay/infra/mem"
	emf "github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// docs/serve.md names every metric the server exports, and maps every EMF
// metric of the Lambda functions to one: the two hosts carry the same
// signals.
func TestDocumentsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(nil)
	m.alarm(context.Background(), "s", relaycore.AlarmResult{Cleared: true, RowsDelivered: 1}, nil)
	m.sweep(1, nil)
	tm := newTakedownMetrics(m.reg)
	tm.runs.WithLabelValues("ok").Inc()
	m.requests.WithLabelValues("/healthz", "GET", "200").Inc()
	m.duration.WithLabelValues("/healthz", "GET").Observe(0.001)
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "relay_") {
			continue
		}
		n++
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/serve.md does not document %s", name)
		}
	}
	if n < 14 {
		t.Fatalf("only %d relay_ metrics gathered", n)
	}
	for _, name := range emf.Names {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/serve.md maps no Prometheus metric to the EMF metric %s", name)
		}
	}
}

// docs/api.md's error table, the one a client author reads, lists the
// refusals the server makes itself with their statuses (docs/serve.md
// details them).
func TestAPIDocListsServerErrors(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| 401 | `unauthenticated` |", "| 403 | `forbidden` |", "| 408 | `body_incomplete` |", "`too_large`"} {
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/api.md's error table lacks %q", row)
		}
	}
}

// An alarm that meets another fire's claim drops the source's gauges: with
// replicas on one database another process fires the source now and
// reports it, and this one's last reading would only go stale (an
// undelivered age growing for rows delivered elsewhere, a quarantine
// released elsewhere). Counters stay: they are this process's own work.
func TestBusyAlarmDropsSourceGauges(t *testing.T) {
	m := newMetrics(nil)
	ctx := context.Background()
	series := func() map[string]bool {
		t.Helper()
		families, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, f := range families {
			for _, mt := range f.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "source" && l.GetValue() == "s" {
						out[f.GetName()] = true
					}
				}
			}
		}
		return out
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true, RowsDelivered: 3, Hold: relaycore.HoldSummary{Quarantined: 1}}, nil)
	gauges := []string{"relay_targets_blocked", "relay_targets_quarantined", "relay_targets_paused", "relay_rows_held", "relay_oldest_undelivered_age_seconds"}
	before := series()
	for _, g := range gauges {
		if !before[g] {
			t.Fatalf("no %s series for s after its alarm: %v", g, before)
		}
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Busy: true}, nil)
	after := series()
	for _, g := range gauges {
		if after[g] {
			t.Errorf("%s{source=s} still exported after a busy alarm", g)
		}
	}
	if !after["relay_rows_delivered_total"] {
		t.Error("relay_rows_delivered_total{source=s} dropped: counters stay")
	}
}

// A source's gauges follow what happens to it elsewhere: after an
// operator action through another replica (or the API, with no alarm
// here), the next refresh reads the store's figures, where the gauges had
// kept the last alarm's. Sources whose gauges were set within the period,
// or that this replica does not export, are not read.
func TestRefreshFollowsTheStore(t *testing.T) {
	ctx := context.Background()
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	h := &relaycore.RelayHandler{Source: src, Target: dst}
	m := newMetrics(src)
	gauge := func(g *prometheus.GaugeVec) float64 { return testutil.ToFloat64(g.WithLabelValues("s")) }
	rows := []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}
	if _, err := h.Enqueue(ctx, "s", rows, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	actor := relaycore.Actor{By: "ops", Reason: "test"}
	if _, err := h.Quarantine(ctx, "s", "t", actor); err != nil {
		t.Fatal(err)
	}
	res, err := h.Alarm(ctx, "s") // this replica's alarm sees the quarantine
	m.alarm(ctx, "s", res, err)
	if q, held := gauge(m.quarantined), gauge(m.held); q != 1 || held != 1 {
		t.Fatalf("after the alarm: quarantined %v, held %v; want 1 and 1", q, held)
	}
	// Another replica releases the target and delivers the row.
	other := &relaycore.RelayHandler{Source: src, Target: dst}
	if _, err := other.Release(ctx, "s", "t", actor); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Alarm(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if q := gauge(m.quarantined); q != 1 {
		t.Fatalf("quarantined %v before any refresh; the test wants the stale reading first", q)
	}
	now := time.Now().UnixMilli()
	if n := m.refresh(ctx, now, time.Hour.Milliseconds()); n != 0 {
		t.Fatalf("a refresh for gauges older than an hour read %d sources; want none (set just now)", n)
	}
	if n := m.refresh(ctx, now+1000, 1000); n != 1 {
		t.Fatalf("refresh read %d sources, want 1", n)
	}
	if q, held, b := gauge(m.quarantined), gauge(m.held), gauge(m.blocked); q != 0 || held != 0 || b != 0 {
		t.Fatalf("after the refresh: quarantined %v, held %v, blocked %v; want the store's 0, 0, 0", q, held, b)
	}
	// A busy alarm drops the source: it is no longer refreshed here.
	m.alarm(ctx, "s", relaycore.AlarmResult{Busy: true}, nil)
	if n := m.refresh(ctx, now+10_000, 0); n != 0 {
		t.Fatalf("refresh read %d sources after the busy alarm dropped s; want none", n)
	}
}

// The oldest undelivered commit time an alarm leaves for the age gauge:
// the bound its re-arm read when it has one (the store is not read), the
// store's (SourceRelayState) when it has none, none once the alarm cleared
// the outbox with nothing held (held rows keep theirs).
func TestAlarmOldestCommitTime(t *testing.T) {
	ctx := context.Background()
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	h := &relaycore.RelayHandler{Source: src, Target: dst}
	rows := []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}
	if _, err := h.Enqueue(ctx, "s", rows, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := relaycore.SourceRelayState(ctx, src, "s", time.Now())
	if err != nil || st.Empty || st.LowerBoundMS <= 0 {
		t.Fatalf("source state %+v, %v; want a row pending", st, err)
	}
	m := newMetrics(src)
	lower := func() (int64, bool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.seen["s"].lowerMS, m.seen["s"].known
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{}, nil)
	if got, known := lower(); !known || got != st.LowerBoundMS {
		t.Fatalf("an alarm without a bound: %d (known %v), want the store's %d", got, known, st.LowerBoundMS)
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{LowerBoundMS: st.LowerBoundMS - 5000}, nil)
	if got, _ := lower(); got != st.LowerBoundMS-5000 {
		t.Fatalf("an alarm with a bound: %d, want its own %d, not the store's", got, st.LowerBoundMS-5000)
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true}, nil)
	if got, known := lower(); !known || got != 0 {
		t.Fatalf("an alarm that cleared the outbox with nothing held: %d (known %v), want none", got, known)
	}
	// Cleared with a quarantined target's rows held: they are undelivered.
	heldHold := relaycore.HoldSummary{Quarantined: 1, HeldRows: 2}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true, Hold: heldHold, LowerBoundMS: 7}, nil)
	if got, known := lower(); !known || got != 7 {
		t.Fatalf("an alarm that cleared the outbox with rows held: %d (known %v), want its bound 7", got, known)
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true, Hold: heldHold}, nil)
	if got, known := lower(); !known || got != st.LowerBoundMS {
		t.Fatalf("an alarm that cleared with rows held and no bound: %d (known %v), want the store's %d", got, known, st.LowerBoundMS)
	}
}

// Rows committed through the server age the oldest-undelivered gauge of a
// source that showed nothing undelivered, so a source whose fires fail (a
// database outage) shows a growing age instead of 0 with rows waiting;
// a known older bound is kept; the next alarm that clears resets it.
func TestCommittedRowsAgeTheGauge(t *testing.T) {
	ctx := context.Background()
	m := newMetrics(nil)
	age := func() (int64, bool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.seen["s"].lowerMS, m.seen["s"].known
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true, RowsDelivered: 1}, nil)
	if got, known := age(); !known || got != 0 {
		t.Fatalf("after a clearing alarm: %d (known %v), want 0", got, known)
	}
	m.committed("s", 1_800_000_000_000)
	m.alarm(ctx, "s", relaycore.AlarmResult{}, errors.New("store unavailable"))
	if got, known := age(); !known || got != 1_800_000_000_000 {
		t.Fatalf("rows committed, then a failed alarm: %d (known %v), want the commit time", got, known)
	}
	m.committed("s", 1_800_000_005_000)
	if got, _ := age(); got != 1_800_000_000_000 {
		t.Fatalf("a later commit moved the bound to %d; the older row still waits", got)
	}
	m.committed("other", 1_800_000_001_000)
	if lower, known := m.seen["other"].lowerMS, m.seen["other"].known; !known || lower != 1_800_000_001_000 {
		t.Fatalf("a source first seen by a commit: %d (known %v)", lower, known)
	}
	m.alarm(ctx, "s", relaycore.AlarmResult{Cleared: true, RowsDelivered: 2}, nil)
	if got, _ := age(); got != 0 {
		t.Fatalf("after the alarm that delivered them: %d, want 0", got)
	}
}
