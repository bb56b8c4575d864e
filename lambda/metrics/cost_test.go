package metrics_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// TestAgeCost measures what the oldest-undelivered age costs an alarm
// against DynamoDB: nothing, whatever the backlog (the alarm reports the
// bound its re-arm read, AlarmResult.LowerBoundMS), and the age it
// reports is what a read of the source's head (SourceRelayState) gives
// (docs/operations.md states these figures).
func TestAgeCost(t *testing.T) {
	ep := dynamotest.Start(t)
	client := ep.Client(nil)
	for _, tbl := range []string{"src", "tgt"} {
		if err := dynamo.CreateTable(t.Context(), client, tbl); err != nil {
			t.Fatal(err)
		}
	}
	src, tgt := dynamo.New(client, "src", dynamo.Options{}), dynamo.New(client, "tgt", dynamo.Options{})
	clock := fixedClock{t0}
	// 600 rows over 60 targets: more than one Free alarm delivers.
	var rows []relaycore.Row
	for i := range 600 {
		rows = append(rows, relaycore.Row{Target: relaycore.Partition(fmt.Sprintf("t%02d", i%60)),
			Puts: []relaycore.KV{{Key: fmt.Sprintf("k%d", i), Value: bytes.Repeat([]byte("v"), 64)}}})
	}
	if _, err := (&relaycore.RelayHandler{Source: src, Clock: clock}).Enqueue(t.Context(), "orders", rows, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	relay := &relaycore.RelayHandler{Source: src, Target: tgt, Clock: clock}
	var out bytes.Buffer
	rec := &metrics.Recorder{Out: &out, Clock: clock, State: src}
	for {
		ar, err := relay.Alarm(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		before := src.Stats()
		rec.Alarm(t.Context(), metrics.AlarmOutcome{Source: "orders", Result: ar})
		after := src.Stats()
		q, rru, other := after.Query-before.Query, after.ReadUnits-before.ReadUnits, after.GetItem-before.GetItem+after.TransactWriteItems-before.TransactWriteItems
		t.Logf("alarm delivered %d, cleared %v: age read %d Query, %.1f RRU", ar.RowsDelivered, ar.Cleared, q, rru)
		switch {
		case other != 0:
			t.Fatalf("the age read made %d other requests", other)
		case q != 0 || rru != 0:
			t.Fatalf("the age cost %d queries, %.1f RRU; want none", q, rru)
		}
		if !ar.Cleared {
			st, err := relaycore.SourceRelayState(t.Context(), src, "orders", clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf(`"OldestUndeliveredAge":%d`, clock.Now().UnixMilli()-st.LowerBoundMS)
			if last := lastLine(out.String()); !strings.Contains(last, want) {
				t.Fatalf("metric line %s; want %s (the source's head as read)", last, want)
			}
		}
		if ar.Cleared {
			break
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
