package relaycore_test

import (
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// An enqueue batch whose response is lost may be resolved only after its
// rows were delivered and their page deleted, and another writer has
// committed since: neither os nor the first page tells it landed any more.
// Its tag in os.recent does; without that evidence the writer would take
// the batch for lost and commit the rows again under new seqs.
func TestAmbiguousEnqueueResolvedAfterDelivery(t *testing.T) {
	e := newEnv(t, "free")
	raw := &relaycore.RelayHandler{Source: e.src, Target: e.tgt, Budget: e.h.Budget, Clock: e.clock}
	done := false
	e.srcF.set(nil, func(c call) error {
		if c.Op != "apply" || done {
			return nil
		}
		done = true
		// Before the writer learns the outcome: a fire delivers the rows
		// and deletes their page, and another writer commits.
		if res, err := raw.Fire(e.ctx, e.source); err != nil || res.RowsCleaned != 1 {
			t.Fatalf("fire between the commit and its answer: %+v, %v", res, err)
		}
		e.enqueue(put("other", "o", "1"))
		return maybeApplied()
	})
	res, err := relaycore.CommitRelayRows(e.ctx, e.srcF, e.clock, e.source, nil, time.Time{}, []relaycore.Row{put("t", "k", "v")}, relaycore.EnqueueConfig{})
	e.srcF.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Seqs[0] != 1 || res.Replans != 0 {
		t.Fatalf("result %+v: want the row reported at seq 1 without a re-plan", res)
	}
	v := e.inspect(e.source)
	for _, r := range v.Rows() {
		if r.Target == "t" {
			t.Fatalf("the delivered row was committed again as seq %d", r.Seq)
		}
	}
	if v.OS.NextSeq != 3 {
		t.Fatalf("os.next = %d, want 3 (our row and the other writer's)", v.OS.NextSeq)
	}
}
