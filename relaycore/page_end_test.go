package relaycore_test

import (
	"fmt"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// A target's last apply call in a fire ends at a page end when one lies
// within it, so the checkpoint deletes whole pages instead of rewriting a
// partly delivered one (on DynamoDB a transactional put of the remaining
// rows, and their delete later, for rows the next fire delivers anyway).
// Three pages of 30 rows, a target batch of 45 rows and one call per target
// per fire: each fire delivers one whole page (30 rows, not 45), and every
// page left in the outbox is untouched (its first row is the seq its key
// names). Without the trim the first fire delivers 45 rows and rewrites the
// second page from its 16th row.
func TestLastCallEndsAtPageEnd(t *testing.T) {
	e := newEnv(t, "paid")
	e.tgt = mem.New(relaycore.Capabilities{MaxBatchItems: 46}) // 45 rows and rh
	e.tgtF.Store = e.tgt
	e.h.Budget.CallsPerTarget, e.h.Budget.FiresPerAlarm = 1, 1
	for b := range 3 {
		var rows []relaycore.Row
		for i := range 30 {
			rows = append(rows, put("t", fmt.Sprintf("k%03d", 30*b+i), "v"))
		}
		e.enqueue(rows...)
	}
	for fire := 1; fire <= 3; fire++ {
		ar, err := e.h.Alarm(e.ctx, e.source)
		if err != nil {
			t.Fatal(err)
		}
		if ar.RowsDelivered != 30 {
			t.Fatalf("fire %d delivered %d rows, want one whole page of 30", fire, ar.RowsDelivered)
		}
		v := e.inspect(e.source)
		if len(v.Pages) != 3-fire {
			t.Fatalf("fire %d: %d pages left, want %d", fire, len(v.Pages), 3-fire)
		}
		for _, p := range v.Pages {
			if p.Key != layout.PageKey(p.First) {
				t.Fatalf("fire %d: page %s starts at seq %d: rewritten after a partial delivery", fire, p.Key, p.First)
			}
		}
	}
	for i := range 90 {
		if got, ok := e.target("t", fmt.Sprintf("k%03d", i)); !ok || got != "v" {
			t.Fatalf("k%03d = %q, %v at the target", i, got, ok)
		}
	}
}
