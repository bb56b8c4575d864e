package relaycore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

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

// A source with a single writer: once DeclareLeaseRequired marks it, an
// enqueue needs the source's lease. A writer acquires it, enqueues under it,
// and releases it; an enqueue under the released lease fails closed, and
// the next writer may take the lease at once instead of waiting for it to
// expire.
func ExampleAcquireLease() {
	ctx := context.Background()
	h := &relaycore.RelayHandler{Source: mem.New(relaycore.Capabilities{}), Target: mem.New(relaycore.Capabilities{})}
	if err := relaycore.DeclareLeaseRequired(ctx, h.Source, "ledger"); err != nil {
		log.Fatal(err)
	}
	rows := []relaycore.Row{{Target: "books", Puts: []relaycore.KV{{Key: "entry/1", Value: []byte("+42")}}}}
	_, err := h.Enqueue(ctx, "ledger", rows, relaycore.EnqueueOptions{})
	fmt.Println("without a lease:", errors.Is(err, relaycore.ErrLeaseRequired))

	l, err := relaycore.AcquireLease(ctx, h.Source, "ledger", "writer-a", time.Minute, time.Now())
	if err != nil {
		log.Fatal(err)
	}
	res, err := h.Enqueue(ctx, "ledger", rows, relaycore.EnqueueOptions{Lease: &l})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Holder, "epoch", l.Epoch, "seqs", res.Seqs)
	if err := relaycore.ReleaseLease(ctx, h.Source, "ledger", l); err != nil {
		log.Fatal(err)
	}
	_, err = h.Enqueue(ctx, "ledger", rows, relaycore.EnqueueOptions{Lease: &l})
	fmt.Println("under the released lease:", errors.Is(err, relaycore.ErrStaleLease))

	next, err := relaycore.AcquireLease(ctx, h.Source, "ledger", "writer-b", time.Minute, time.Now())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(next.Holder, "epoch", next.Epoch)
	// Output:
	// without a lease: true
	// writer-a epoch 1 seqs [1]
	// under the released lease: true
	// writer-b epoch 1
}

// A takedown request travels to a target as a relay row (NewTakedownRow).
// TakedownRequestTimer, here chained after a hook that keeps a record of
// which node holds what, adds to the same target batch the durable handoff
// the future takedown owner reads: the request and when its timer is due.
func ExampleTakedownRequestTimer() {
	ctx := context.Background()
	holders := relaycore.HolderRelayHook{Prefix: "holder/", Observations: map[relaycore.Partition][]relaycore.KV{
		"region-1": {{Key: "edge-7", Value: []byte("seg-9f2c")}},
	}}
	dst := mem.New(relaycore.Capabilities{})
	h := &relaycore.RelayHandler{Source: mem.New(relaycore.Capabilities{}), Target: dst,
		Hook: relaycore.ChainHooks(holders, relaycore.TakedownRequestTimer{Delay: 24 * time.Hour})}
	row, err := relaycore.NewTakedownRow("region-1", relaycore.ContentTakedownV1{Version: 1,
		ContentID: "seg-9f2c", LateHolder: "edge-7", RequestedMS: 1800000000123, Reason: "dmca 2026-118"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := h.Enqueue(ctx, "takedowns", []relaycore.Row{row}, relaycore.EnqueueOptions{}); err != nil {
		log.Fatal(err)
	}
	if _, err := h.Fire(ctx, "takedowns"); err != nil {
		log.Fatal(err)
	}
	page, err := relaycore.ReadTarget(ctx, dst, "region-1", relaycore.TargetReadRequest{})
	if err != nil {
		log.Fatal(err)
	}
	for _, kv := range page.Items {
		switch {
		case strings.HasPrefix(kv.Key, relaycore.TakedownHandoffPrefix):
			ho, err := relaycore.DecodeTakedownHandoff(kv.Value)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println("handoff of", ho.Request.ContentID, "timer due", time.UnixMilli(ho.TimerDueMS).UTC().Format(time.RFC3339))
		case strings.HasPrefix(kv.Key, relaycore.TakedownPrefix):
			t, err := relaycore.DecodeTakedown(kv.Value)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println("request for", t.ContentID, "held by", t.LateHolder)
		default:
			fmt.Printf("%s = %s\n", kv.Key, kv.Value)
		}
	}
	// Output:
	// holder/edge-7 = seg-9f2c
	// handoff of seg-9f2c timer due 2027-01-16T08:00:00Z
	// request for seg-9f2c held by edge-7
}
