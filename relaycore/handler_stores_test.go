package relaycore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// A handler without the stores an operation needs refuses it with an
// error naming what is missing, before reading or writing anything. A
// producer's handler (no Target) enqueues; its Alarm, Fire and Skip
// refuse. Before, a nil Target surfaced as a nil-pointer panic in the
// first delivery, after Enqueue had taken the rows: in an alarm clock's
// worker, a crash at every start once the claim lapsed.
func TestHandlerWithoutStores(t *testing.T) {
	ctx := context.Background()
	src := mem.New(relaycore.Capabilities{})
	producer := &relaycore.RelayHandler{Source: src}
	if _, err := producer.Enqueue(ctx, "s", []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatalf("a producer's handler (no Target) enqueues: %v", err)
	}
	wantErr := func(op string, err error, missing string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("%s: %v; want an error naming %q", op, err, missing)
		}
	}
	_, err := producer.Alarm(ctx, "s")
	wantErr("Alarm without a Target", err, "without a Target store")
	_, err = producer.Fire(ctx, "s")
	wantErr("Fire without a Target", err, "without a Target store")
	_, err = producer.Skip(ctx, "s", relaycore.SkipRequest{Target: "t", ExpectFirst: 1, Through: 1, Actor: relaycore.Actor{By: "op", Reason: "r"}})
	wantErr("Skip without a Target", err, "without a Target store")
	// Nothing was claimed or moved: a handler with both stores delivers
	// the row at once.
	full := &relaycore.RelayHandler{Source: src, Target: mem.New(relaycore.Capabilities{})}
	if ar, err := full.Alarm(ctx, "s"); err != nil || ar.Busy || ar.RowsDelivered != 1 {
		t.Fatalf("alarm with both stores: %+v, %v; want the row delivered", ar, err)
	}

	none := &relaycore.RelayHandler{}
	_, err = none.Alarm(ctx, "s")
	wantErr("Alarm without a Source", err, "without a Source store")
	_, err = none.Quarantine(ctx, "s", "t", relaycore.Actor{By: "op", Reason: "r"})
	wantErr("Quarantine without a Source", err, "without a Source store")
	var nilHandler *relaycore.RelayHandler
	_, err = nilHandler.Enqueue(ctx, "s", []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueOptions{})
	wantErr("Enqueue on a nil handler", err, "nil *RelayHandler")
}

// Enqueue applies the one rule for source ids (SourceIDProblem) that the
// API and the relay CLI apply, so no source is created that the operator
// tools could not name; nothing is written.
func TestEnqueueRefusesBadSourceID(t *testing.T) {
	ctx := context.Background()
	src := mem.New(relaycore.Capabilities{})
	h := &relaycore.RelayHandler{Source: src}
	for _, id := range []relaycore.Partition{"", "s\xff", "s\n", "_relay/x", relaycore.Partition(strings.Repeat("s", 256))} {
		res, err := h.Enqueue(ctx, id, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueOptions{})
		if !errors.Is(err, relaycore.ErrInvalidSourceID) || res.Seqs[0] != 0 {
			t.Fatalf("source %q: %v (seqs %v); want ErrInvalidSourceID and nothing committed", id, err, res.Seqs)
		}
		if len(err.Error()) > 200 {
			t.Fatalf("source of %d bytes: the error quotes it whole: %v", len(id), err)
		}
		if id != "" {
			if _, found, gerr := src.Get(ctx, id, relaycore.KeyOS); gerr == nil && found {
				t.Fatalf("source %q: os written", id)
			}
		}
	}
}

// A state filter that names no state is refused: a misspelt one would
// list nothing, as if no target were in it.
func TestListTargetsRefusesUnknownState(t *testing.T) {
	src := mem.New(relaycore.Capabilities{})
	_, _, err := relaycore.ListTargets(context.Background(), src, "s", relaycore.TargetFilter{State: "quarantine"}, time.Now())
	if !errors.Is(err, relaycore.ErrInvalidOperatorInput) || !strings.Contains(err.Error(), `"quarantine"`) {
		t.Fatalf("state quarantine: %v; want ErrInvalidOperatorInput naming it", err)
	}
	if _, _, err := relaycore.ListTargets(context.Background(), src, "s", relaycore.TargetFilter{State: relaycore.StateQuarantined}, time.Now()); err != nil {
		t.Fatal(err)
	}
}
