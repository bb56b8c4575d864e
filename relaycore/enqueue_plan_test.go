package relaycore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Planning without committing (ReadEnqueueSnapshot + EnqueueRelayRows)
// validates every row too: a caller that commits the plan itself must not
// get batches holding a row the engine would refuse.
func TestEnqueueRelayRowsValidatesRows(t *testing.T) {
	e := newEnv(t, "free")
	snap, err := relaycore.ReadEnqueueSnapshot(e.ctx, e.src, e.source, nil, time.Time{}, e.clock.Now(), relaycore.EnqueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rows := []relaycore.Row{put("t", "k", "v"), {Target: "t"}}
	plan, err := relaycore.EnqueueRelayRows(snap, rows, e.src.Capabilities(), relaycore.EnqueueConfig{})
	var re *relaycore.RowError
	if !errors.As(err, &re) || re.Index != 1 || !errors.Is(err, relaycore.ErrInvalidRow) {
		t.Fatalf("plan of a row with no puts and no deletes: %d batches, err %v; want a *RowError for row 1", len(plan), err)
	}
}
