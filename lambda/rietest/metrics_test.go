//go:build unix

package rietest

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/lambda/sweep"
)

// emfLines returns the EMF documents a bootstrap printed (lines with an
// "_aws" member), checking each has the shape CloudWatch Logs extracts:
// an integer _aws.Timestamp and CloudWatchMetrics directives whose
// dimensions and metrics are root members.
func emfLines(t *testing.T, f *function) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(f.settled(t)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"_aws"`) {
			continue
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(line), &doc); err != nil {
			t.Fatalf("%s printed an EMF line that is not JSON: %s: %v", f.id, line, err)
		}
		var meta struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		}
		raw, _ := json.Marshal(doc["_aws"])
		if err := json.Unmarshal(raw, &meta); err != nil || meta.Timestamp <= 0 || len(meta.CloudWatchMetrics) != 1 {
			t.Fatalf("%s: _aws %s: %v", f.id, raw, err)
		}
		d := meta.CloudWatchMetrics[0]
		if d.Namespace != metrics.DefaultNamespace || len(d.Dimensions) == 0 || len(d.Metrics) == 0 {
			t.Errorf("%s: directive %+v", f.id, d)
		}
		for _, set := range d.Dimensions {
			for _, dim := range set {
				if _, ok := doc[dim].(string); !ok {
					t.Errorf("%s: dimension %s is not a string member: %s", f.id, dim, line)
				}
			}
		}
		for _, m := range d.Metrics {
			if _, ok := doc[m.Name].(float64); !ok {
				t.Errorf("%s: metric %s is not a number member: %s", f.id, m.Name, line)
			}
		}
		out = append(out, doc)
	}
	return out
}

// TestBootstrapsPrintMetrics: the built fire and sweep bootstraps, under
// the emulator with env.json's environment, print EMF lines on stdout (what
// Lambda sends to CloudWatch Logs) for every alarm and sweep, with the
// stack dimension from METRICS_STACK; the sweep's in-process alarm is
// measured like the fire function's.
func TestBootstrapsPrintMetrics(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", map[string]string{"METRICS_STACK": "relay-test"})
	sweepFn := r.start("SweepFunction", map[string]string{"METRICS_STACK": "relay-test"})

	var enq api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	var fr fire.Result
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)
	lines := emfLines(t, fireFn)
	if len(lines) != 1 {
		t.Fatalf("fire printed %d EMF lines, want 1 per alarm:\n%s", len(lines), fireFn.log.String())
	}
	l := lines[0]
	if l["Stack"] != "relay-test" || l["Source"] != "orders" || l[metrics.RowsDelivered] != float64(fr.RowsDelivered) ||
		l[metrics.Alarms] != float64(1) || l[metrics.OldestUndeliveredAge] != float64(0) {
		t.Errorf("fire line %v, want stack relay-test, source orders, %d rows delivered, age 0 (drained)", l, fr.RowsDelivered)
	}

	// A lost kick: the sweep fires the alarm in-process and measures it.
	r.sched.Fail(http.StatusInternalServerError)
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	r.sched.Fail(0)
	var sr sweep.Result
	sweepFn.invokeOK(t, readEvent(t, "sweep.json"), &sr)
	lines = emfLines(t, sweepFn)
	if len(lines) != 3 {
		t.Fatalf("sweep printed %d EMF lines, want the alarm's, its own and its takedown owner pass's:\n%s", len(lines), sweepFn.log.String())
	}
	if td := lines[2]; td[metrics.TakedownsOpen] != float64(0) || td[metrics.TakedownErrors] != float64(0) {
		t.Errorf("sweep's takedown line %v, want no takedowns and no errors", td)
	}
	if a := lines[0]; a["Source"] != "orders" || a[metrics.RowsDelivered] != float64(2) {
		t.Errorf("sweep's alarm line %v", a)
	}
	if s := lines[1]; s[metrics.SweepOverdue] != float64(1) || s[metrics.SweepFired] != float64(1) || s[metrics.SweepErrors] != float64(0) || s["Stack"] != "relay-test" {
		t.Errorf("sweep line %v, want 1 overdue fired, no errors", s)
	}
}
