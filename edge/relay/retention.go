package relay

import (
	"context"
	"fmt"
	"time"
)

// PruneSettled applies relay.ledger_retention: the records of a segment
// that is no longer stored (evicted on relay, or gone otherwise) are
// removed once every one of them has been Acked for at least Retention
// (ledger.RemoveSettled, which checks the segment index in the same
// transaction). Records with a Deadletter among them stay until the
// operator purges the deadletter. It returns the number of records
// removed; with Retention 0 it does nothing.
//
// After removal nothing is left to re-send: start-up reconciliation only
// schedules segments that are stored. A copy of the segment received
// again after the window is a new segment to this agent and is relayed
// to its required peers again (they acknowledge a copy they hold).
func (e *Executor) PruneSettled() (int, error) {
	if e.cfg.Retention <= 0 {
		return 0, nil
	}
	segs, recs, err := e.led.RemoveSettled(e.cfg.Now().Add(-e.cfg.Retention), e.store.HeldIn)
	if err != nil {
		return 0, fmt.Errorf("prune settled records: %w", err)
	}
	if recs > 0 {
		e.log.Info("ledger retention removed records", "segments", segs, "records", recs, "retention", e.cfg.Retention)
		if f := e.cfg.Observer.Removed; f != nil {
			f(recs)
		}
	}
	return recs, nil
}

// retentionInterval is how often Run applies retention: often enough that
// records outlive the window by at most an eighth of it (and at most an
// hour), rarely enough that the full scan costs nothing.
func retentionInterval(retention time.Duration) time.Duration {
	return min(max(retention/8, time.Minute), time.Hour)
}

func (e *Executor) retentionLoop(ctx context.Context) {
	t := time.NewTicker(retentionInterval(e.cfg.Retention))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := e.PruneSettled(); err != nil {
				e.log.Error("ledger retention failed", "err", err)
			}
		}
	}
}
