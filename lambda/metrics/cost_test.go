package metrics_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// TestAgeCost measures what the oldest-undelivered age costs an alarm
// against DynamoDB: one strongly consistent Query of the source's head,
// whatever the backlog, and nothing when the alarm cleared the outbox
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
		case ar.Cleared && q != 0:
			t.Fatalf("a cleared alarm cost %d queries", q)
		case !ar.Cleared && (q != 1 || rru > 3):
			t.Fatalf("age read: %d queries, %.1f RRU; want 1 query of at most 3 RRU", q, rru)
		}
		if ar.Cleared {
			break
		}
	}
}
