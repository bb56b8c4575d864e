package sweep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

func decodeLines(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var d map[string]any
		if err := json.Unmarshal(l, &d); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		docs = append(docs, d)
	}
	return docs
}

// TestSweepRecordsMetrics: every alarm the sweep fires in-process writes
// its alarm line (sources fired by the sweep are measured like the fire
// function's), and the sweep writes its counts last.
func TestSweepRecordsMetrics(t *testing.T) {
	e := newEnv(t)
	var out bytes.Buffer
	e.h.Metrics = &metrics.Recorder{Out: &out, State: e.src, Clock: e.clock}
	e.h.FireLimit, e.h.Parallel = 2, 2
	e.enqueue(t, "a", "b", "c")
	e.sweep(t, t.Context())
	docs := decodeLines(t, out.Bytes())
	if len(docs) != 3 {
		t.Fatalf("%d lines, want 2 alarms and the sweep: %s", len(docs), out.Bytes())
	}
	sources := map[any]bool{}
	for _, d := range docs[:2] {
		sources[d["Source"]] = true
		if d[metrics.RowsDelivered] != float64(1) || d[metrics.OldestUndeliveredAge] != float64(0) {
			t.Errorf("alarm line %v", d)
		}
	}
	if !sources["a"] || !sources["b"] {
		t.Errorf("alarm lines for %v, want a and b", sources)
	}
	s := docs[2]
	if s[metrics.SweepOverdue] != float64(3) || s[metrics.SweepFired] != float64(2) || s[metrics.SweepKicked] != float64(1) || s[metrics.SweepErrors] != float64(0) {
		t.Errorf("sweep line %v", s)
	}
}

// TestSweepFailureRecordsError: a sweep that cannot read the due index
// fails and still counts an error, which the SweepErrors alarm watches.
func TestSweepFailureRecordsError(t *testing.T) {
	e := newEnv(t)
	var out bytes.Buffer
	e.h.Metrics = &metrics.Recorder{Out: &out, Clock: e.clock}
	e.h.Index = brokenIndex{}
	if _, err := e.h.Handle(t.Context(), []byte(`{}`)); err == nil {
		t.Fatal("want the index error")
	}
	docs := decodeLines(t, out.Bytes())
	if len(docs) != 1 || docs[0][metrics.SweepErrors] != float64(1) {
		t.Errorf("lines %s, want one sweep line with SweepErrors 1", out.Bytes())
	}
}

type brokenIndex struct{}

func (brokenIndex) Due(context.Context, int64, int) ([]relaycore.DueEntry, error) {
	return nil, errors.New("index unavailable")
}
