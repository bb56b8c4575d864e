package relayserve

import (
	"context"
	"os"
	"strings"
	"testing"

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
