package relay

import (
	"errors"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// checkSuccessCondition evaluates segmentID's success condition and acts
// on it: the relayed marker first (durable), then, with evict_on_relay,
// the gated eviction. It is called after every terminal transition of one
// of the segment's records, when the segment is stored (Schedule) and at
// start-up; it is idempotent. Errors are
// logged, not returned: the next call repeats whatever did not happen.
func (e *Executor) checkSuccessCondition(segmentID string) {
	entry, err := e.store.Stat(segmentID)
	if errors.Is(err, segstore.ErrNotFound) {
		return // evicted already (or by the operator)
	}
	log := e.log.With("segment", segmentID)
	if err != nil {
		log.Error("success check: stat failed", "err", err)
		return
	}
	required := e.RequiredPeers(entry)
	a, err := e.led.Assurance(segmentID, required, e.cfg.Condition)
	if err != nil {
		log.Error("success check: assurance failed", "err", err)
		return
	}
	if !a.Met {
		return
	}
	if !entry.Relayed {
		var marked bool
		if entry, marked, err = e.store.MarkRelayed(segmentID); err != nil {
			log.Error("success check: marking relayed failed", "err", err)
			return
		}
		// Workers finishing acks of one segment at once all get here;
		// only the one whose call set the marker reports the success.
		if marked {
			log.Info("relay success", "condition", string(e.cfg.Condition), "acks", len(a.AckedPeers),
				"acked_peers", a.AckedPeers, "required", len(required))
			if f := e.cfg.Observer.Relayed; f != nil {
				f(segmentID)
			}
		}
	}
	if !e.cfg.EvictOnRelay {
		return
	}
	// The relayed marker is committed; the gate re-checks the ledger in
	// the eviction's own transaction.
	err = e.store.EvictIf(segmentID, e.led.EvictionGate(segmentID, required, e.cfg.Condition))
	switch {
	case err == nil:
		log.Info("segment evicted on relay", "bytes", entry.Size)
		if f := e.cfg.Observer.Evicted; f != nil {
			f(segmentID, entry.Size)
		}
	case errors.Is(err, ledger.ErrEvictionBlocked):
		log.Debug("eviction waits for pending deliveries", "reason", err)
	case errors.Is(err, segstore.ErrNotFound), errors.Is(err, segstore.ErrBusy):
		// Someone else is evicting it; nothing to do.
	default:
		log.Error("evict on relay failed", "err", err)
	}
}
