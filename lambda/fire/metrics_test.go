package fire_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// lines decodes EMF lines into their root members.
func lines(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var d map[string]any
		if err := json.Unmarshal(l, &d); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		docs = append(docs, d)
	}
	return docs
}

// TestFireRecordsMetrics: each alarm writes one EMF line for its source,
// with the rows delivered and, while rows remain, the oldest undelivered
// age; a failed alarm writes the failure.
func TestFireRecordsMetrics(t *testing.T) {
	e := newEnv(t, "free")
	var out bytes.Buffer
	e.h.Metrics = &metrics.Recorder{Out: &out, State: e.src, Clock: e.clock}
	e.enqueue(t, 40) // Free: 16 targets an alarm, so rows remain
	e.fire(t)
	docs := lines(t, out.Bytes())
	if len(docs) != 1 {
		t.Fatalf("%d lines, want 1: %s", len(docs), out.Bytes())
	}
	d := docs[0]
	if d["Source"] != "orders" || d[metrics.RowsDelivered] != float64(16) || d[metrics.AlarmsIdle] != float64(0) {
		t.Errorf("line %v", d)
	}
	if age, ok := d[metrics.OldestUndeliveredAge].(float64); !ok || age < 0 {
		t.Errorf("age %v, want a non-negative age while rows remain", d[metrics.OldestUndeliveredAge])
	}

	out.Reset()
	e.h.Relay = failingAlarm{}
	if _, err := e.h.Handle(t.Context(), []byte(`{"source":"orders"}`)); err == nil {
		t.Fatal("want the alarm's error")
	}
	docs = lines(t, out.Bytes())
	if len(docs) != 1 || docs[0][metrics.AlarmsFailed] != float64(1) {
		t.Errorf("failed alarm lines %s", out.Bytes())
	}
}

type failingAlarm struct{}

func (failingAlarm) Alarm(_ context.Context, _ relaycore.Partition) (relaycore.AlarmResult, error) {
	return relaycore.AlarmResult{}, errors.New("storage down")
}
