package relaycore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// An embedded relay on one bbolt file: the handler is wired once (stores,
// and the in-process alarm clock as its Kicker), Enqueue commits a row and
// kicks the clock, and the clock's alarm delivers the row to the target.
// The README's "Embedding the engine" quotes this function's body
// (TestReadmeQuotesExample keeps them in step).
func ExampleRelayHandler() {
	dir, err := os.MkdirTemp("", "relay-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := bolt.Open(filepath.Join(dir, "relay.db"), bolt.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	src, dst := db.Store("source"), db.Store("target") // or infra/dynamo

	h := &relaycore.RelayHandler{Source: src, Target: dst}
	delivered := make(chan int, 1)
	clock := alarmclock.New(alarmclock.Config{Handler: h, Index: src,
		Observe: func(_ relaycore.Partition, r relaycore.AlarmResult, _ error) {
			if r.RowsDelivered > 0 {
				delivered <- r.RowsDelivered
			}
		}})
	h.Kicker = clock // every Enqueue wakes the source's alarm at once
	ctx, stop := context.WithCancel(context.Background())
	running := make(chan error, 1)
	go func() { running <- clock.Run(ctx) }()
	defer func() { stop(); <-running }()

	res, err := h.Enqueue(ctx, "orders", []relaycore.Row{
		{Target: "customer-42", Puts: []relaycore.KV{{Key: "order/1001", Value: []byte(`{"total":42}`)}}},
	}, relaycore.EnqueueOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed seqs", res.Seqs)
	fmt.Println("delivered rows", <-delivered)
	v, _, err := dst.Get(ctx, "customer-42", "order/1001")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("customer-42 holds order/1001 = %s\n", v)
	// Output:
	// committed seqs [1]
	// delivered rows 1
	// customer-42 holds order/1001 = {"total":42}
}

// Enqueue with an idempotency key: a retry of the same rows under the same
// key (after a lost response, say) commits nothing and answers with the
// first call's seqs. Rows are ordered per (source, target): each target's
// rows get contiguous seqs.
func ExampleRelayHandler_Enqueue() {
	h := &relaycore.RelayHandler{Source: mem.New(relaycore.Capabilities{}), Target: mem.New(relaycore.Capabilities{})}
	rows := []relaycore.Row{
		{Target: "customer-42", Puts: []relaycore.KV{{Key: "order/1001", Value: []byte("placed")}}},
		{Target: "billing", Puts: []relaycore.KV{{Key: "invoice/7", Value: []byte("due")}}},
		{Target: "customer-42", Deletes: []string{"cart/1001"}},
	}
	opts := relaycore.EnqueueOptions{IdempotencyKey: "checkout-1001"}
	for range 2 {
		res, err := h.Enqueue(context.Background(), "orders", rows, opts)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("seqs", res.Seqs, "replayed", res.Replayed)
	}
	// Output:
	// seqs [1 3 2] replayed false
	// seqs [1 3 2] replayed true
}

// An operator quarantines a target (its rows stay in the outbox, the other
// targets keep flowing), reads its state, and releases it.
func ExampleRelayHandler_Quarantine() {
	ctx := context.Background()
	h := &relaycore.RelayHandler{Source: mem.New(relaycore.Capabilities{}), Target: mem.New(relaycore.Capabilities{})}
	if _, err := h.Enqueue(ctx, "orders", []relaycore.Row{
		{Target: "customer-42", Puts: []relaycore.KV{{Key: "order/1001", Value: []byte("placed")}}},
	}, relaycore.EnqueueOptions{}); err != nil {
		log.Fatal(err)
	}
	who := relaycore.Actor{By: "alice", Reason: "customer-42's endpoint is down"}
	if _, err := h.Quarantine(ctx, "orders", "customer-42", who); err != nil {
		log.Fatal(err)
	}
	st, err := relaycore.GetTarget(ctx, h.Source, "orders", "customer-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, "pending", st.Pending, "first seq", st.FirstSeq, "by", st.Note.By)
	st, err = h.Release(ctx, "orders", "customer-42", relaycore.Actor{By: "alice", Reason: "endpoint back"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, "pending", st.Pending)
	// Output:
	// quarantined pending 1 first seq 1 by alice
	// active pending 1
}
