package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

var t0 = time.UnixMilli(1_800_000_000_000)

// Each case's want is the exact line: the EMF document shape CloudWatch
// Logs extracts (_aws.Timestamp in ms, CloudWatchMetrics[{Namespace,
// Dimensions, Metrics[{Name, Unit}]}], one root member per dimension and
// metric).
func TestLines(t *testing.T) {
	busy := relaycore.AlarmResult{Busy: true}
	// Cleared with rows held: the held rows' bound is the age.
	full := relaycore.AlarmResult{Fires: 2, RowsDelivered: 7, Blocked: 3, TargetsQuarantined: 1, Cleared: true,
		Hold: relaycore.HoldSummary{Quarantined: 2, Paused: 1, HeldRows: 9}, LowerBoundMS: t0.UnixMilli() - 5000}
	for _, tc := range []struct {
		name string
		rec  *metrics.Recorder
		do   func(r *metrics.Recorder)
		want string
	}{
		{
			name: "alarm aggregate only",
			rec:  &metrics.Recorder{Stack: "prod"},
			do: func(r *metrics.Recorder) {
				r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "orders", Result: full})
			},
			want: `{"Alarms":1,"AlarmsIdle":0,"OldestUndeliveredAge":5000,"RowsDelivered":7,"RowsHeld":9,"Source":"orders","Stack":"prod",` +
				`"TargetsAutoQuarantined":1,"TargetsBlocked":3,"TargetsPaused":1,"TargetsQuarantined":2,` +
				`"_aws":{"Timestamp":1800000000000,"CloudWatchMetrics":[{"Namespace":"Relay","Dimensions":[["Stack"]],"Metrics":[` +
				`{"Name":"Alarms","Unit":"Count"},{"Name":"AlarmsIdle","Unit":"Count"},{"Name":"RowsDelivered","Unit":"Count"},` +
				`{"Name":"TargetsBlocked","Unit":"Count"},{"Name":"TargetsQuarantined","Unit":"Count"},{"Name":"TargetsPaused","Unit":"Count"},` +
				`{"Name":"RowsHeld","Unit":"Count"},{"Name":"TargetsAutoQuarantined","Unit":"Count"},{"Name":"OldestUndeliveredAge","Unit":"Milliseconds"}]}]}}`,
		},
		{
			name: "busy alarm per source, custom namespace",
			rec:  &metrics.Recorder{Namespace: "Acme/Relay", Stack: "prod", PerSource: true},
			do: func(r *metrics.Recorder) {
				r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "orders", Result: busy})
			},
			want: `{"Alarms":1,"AlarmsBusy":1,"Source":"orders","Stack":"prod","_aws":{"Timestamp":1800000000000,"CloudWatchMetrics":[` +
				`{"Namespace":"Acme/Relay","Dimensions":[["Stack"],["Stack","Source"]],"Metrics":[{"Name":"Alarms","Unit":"Count"},{"Name":"AlarmsBusy","Unit":"Count"}]}]}}`,
		},
		{
			name: "failed alarm",
			rec:  &metrics.Recorder{},
			do: func(r *metrics.Recorder) {
				r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "s", Result: relaycore.AlarmResult{RowsDelivered: 2}, Err: errors.New("boom")})
			},
			want: `{"Alarms":1,"AlarmsFailed":1,"RowsDelivered":2,"Source":"s","Stack":"relay","_aws":{"Timestamp":1800000000000,"CloudWatchMetrics":[` +
				`{"Namespace":"Relay","Dimensions":[["Stack"]],"Metrics":[{"Name":"Alarms","Unit":"Count"},{"Name":"AlarmsFailed","Unit":"Count"},{"Name":"RowsDelivered","Unit":"Count"}]}]}}`,
		},
		{
			// A source CloudWatch refuses as a dimension value stays a
			// property: the line is still valid and the aggregate counts.
			name: "per source with a source that is no dimension value",
			rec:  &metrics.Recorder{Stack: "prod", PerSource: true},
			do: func(r *metrics.Recorder) {
				r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "caf\u00e9", Result: busy})
			},
			want: `{"Alarms":1,"AlarmsBusy":1,"Source":"café","Stack":"prod","_aws":{"Timestamp":1800000000000,"CloudWatchMetrics":[` +
				`{"Namespace":"Relay","Dimensions":[["Stack"]],"Metrics":[{"Name":"Alarms","Unit":"Count"},{"Name":"AlarmsBusy","Unit":"Count"}]}]}}`,
		},
		{
			name: "sweep",
			rec:  &metrics.Recorder{Stack: "prod", PerSource: true},
			do: func(r *metrics.Recorder) {
				r.Sweep(metrics.SweepCounts{Overdue: 5, Fired: 3, Kicked: 1, Errors: 1})
			},
			want: `{"Stack":"prod","SweepErrors":1,"SweepFired":3,"SweepKicked":1,"SweepOverdue":5,"_aws":{"Timestamp":1800000000000,"CloudWatchMetrics":[` +
				`{"Namespace":"Relay","Dimensions":[["Stack"]],"Metrics":[{"Name":"SweepOverdue","Unit":"Count"},{"Name":"SweepFired","Unit":"Count"},` +
				`{"Name":"SweepKicked","Unit":"Count"},{"Name":"SweepErrors","Unit":"Count"}]}]}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			r := tc.rec
			r.Out, r.Clock = &out, fixedClock{t0}
			tc.do(r)
			if got := out.String(); got != tc.want+"\n" {
				t.Errorf("line\n got %s\nwant %s", got, tc.want)
			}
			CheckEMF(t, out.Bytes())
		})
	}
}

// CheckEMF validates lines against the EMF specification's rules that a
// hand-written encoder could break: one JSON object per line, _aws with
// an integer Timestamp and at least one directive, every dimension and
// metric named in a directive present at the root, dimension values
// strings, metric values numbers, at most 100 metrics and 30 dimensions
// per set.
func CheckEMF(t *testing.T, out []byte) int {
	t.Helper()
	n := 0
	for _, line := range bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n")) {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(line, &doc); err != nil {
			t.Fatalf("not a JSON object: %s: %v", line, err)
		}
		var meta struct {
			Timestamp         *int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		}
		dec := json.NewDecoder(bytes.NewReader(doc["_aws"]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&meta); err != nil || meta.Timestamp == nil || len(meta.CloudWatchMetrics) == 0 {
			t.Fatalf("_aws %s: %v", doc["_aws"], err)
		}
		for _, d := range meta.CloudWatchMetrics {
			if !metrics.NamespaceOK(d.Namespace) || len(d.Metrics) == 0 || len(d.Metrics) > 100 || len(d.Dimensions) == 0 {
				t.Errorf("directive %+v", d)
			}
			for _, set := range d.Dimensions {
				if len(set) == 0 || len(set) > 30 {
					t.Errorf("dimension set %v", set)
				}
				for _, name := range set {
					var v string
					if err := json.Unmarshal(doc[name], &v); err != nil || !metrics.DimensionValueOK(v) {
						t.Errorf("dimension %s = %s: %v", name, doc[name], err)
					}
				}
			}
			for _, m := range d.Metrics {
				var v float64
				if err := json.Unmarshal(doc[m.Name], &v); err != nil {
					t.Errorf("metric %s = %s: %v", m.Name, doc[m.Name], err)
				}
				if !slices.Contains([]string{metrics.UnitCount, metrics.UnitMilliseconds}, m.Unit) {
					t.Errorf("metric %s unit %q", m.Name, m.Unit)
				}
			}
		}
		n++
	}
	return n
}

// TestAgeFromSourceState: after an alarm that leaves rows, the age is
// now minus the oldest undelivered row's commit time, read from the store.
func TestAgeFromSourceState(t *testing.T) {
	src := mem.New(relaycore.Capabilities{})
	commit := t0.Add(-90 * time.Second)
	if _, err := (&relaycore.RelayHandler{Source: src, Clock: fixedClock{commit}}).Enqueue(context.Background(), "orders", []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := &metrics.Recorder{Out: &out, Clock: fixedClock{t0}, State: src}
	r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "orders", Result: relaycore.AlarmResult{Fires: 1, NextDueMS: t0.UnixMilli()}})
	var doc map[string]any
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc[metrics.OldestUndeliveredAge] != float64(90_000) {
		t.Errorf("age = %v, want 90000 ms (line %s)", doc[metrics.OldestUndeliveredAge], out.Bytes())
	}
	// An empty source that was not cleared by this alarm reads as 0; an
	// unknown one too.
	out.Reset()
	r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "other", Result: relaycore.AlarmResult{Fires: 1}})
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || doc[metrics.OldestUndeliveredAge] != float64(0) {
		t.Errorf("empty source line %s (%v)", out.Bytes(), err)
	}
}

// TestNilRecorder: handlers call a nil recorder without checks.
func TestNilRecorder(t *testing.T) {
	var r *metrics.Recorder
	r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "s"})
	r.Sweep(metrics.SweepCounts{})
}

// TestConcurrentLinesStayWhole: the sweep records alarms from several
// goroutines; every line must arrive whole.
func TestConcurrentLinesStayWhole(t *testing.T) {
	var out bytes.Buffer
	r := &metrics.Recorder{Out: &out, Clock: fixedClock{t0}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				r.Alarm(context.Background(), metrics.AlarmOutcome{Source: "s", Result: relaycore.AlarmResult{Busy: true}})
			}
		})
	}
	wg.Wait()
	if n := CheckEMF(t, out.Bytes()); n != 400 {
		t.Errorf("%d lines, want 400", n)
	}
}

func TestNamespaceAndDimensionRules(t *testing.T) {
	for ns, ok := range map[string]bool{"Relay": true, "Acme/Relay prod#1:a.b-c_d": true, "": false, "AWS/Lambda": false, "bad*": false, strings.Repeat("n", 256): false} {
		if metrics.NamespaceOK(ns) != ok {
			t.Errorf("NamespaceOK(%q) = %v", ns, !ok)
		}
	}
	for v, ok := range map[string]bool{"orders": true, "tenant/42": true, " ": false, "": false, "a\tb": false, "caf\u00e9": false, strings.Repeat("v", 1025): false} {
		if metrics.DimensionValueOK(v) != ok {
			t.Errorf("DimensionValueOK(%q) = %v", v, !ok)
		}
	}
}

// TestDocumentsEveryMetric: docs/operations.md names every metric.
func TestDocumentsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range metrics.Names {
		if !bytes.Contains(doc, []byte("`"+n+"`")) {
			t.Errorf("docs/operations.md does not document `%s`", n)
		}
	}
}
