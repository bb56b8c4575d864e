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
