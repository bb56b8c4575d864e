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
	e.checkSuccessConditions([]string{segmentID})
}

// met is a segment whose success condition holds.
type met struct {
	entry    segstore.Entry
	required []string
	acked    []string
}

// checkSuccessConditions is checkSuccessCondition for several segments:
// the relayed markers they need are set in one transaction (a window of
// ACKs meets a window of conditions at once).
func (e *Executor) checkSuccessConditions(ids []string) {
	var ready []met
	var unmarked []string
	for _, id := range ids {
		entry, err := e.store.Stat(id)
		if errors.Is(err, segstore.ErrNotFound) {
			continue // evicted already (or by the operator)
		}
		log := e.log.With("segment", id)
		if err != nil {
			log.Error("success check: stat failed", "err", err)
			continue
		}
		required := e.RequiredPeers(entry)
		a, err := e.led.Assurance(id, required, e.cfg.Condition)
		if err != nil {
			log.Error("success check: assurance failed", "err", err)
			continue
		}
		if !a.Met {
			continue
		}
		ready = append(ready, met{entry: entry, required: required, acked: a.AckedPeers})
		if !entry.Relayed {
			unmarked = append(unmarked, id)
		}
	}
	if len(unmarked) > 0 {
		marked, err := e.store.MarkRelayedAll(unmarked)
		if err != nil {
			e.log.Error("success check: marking relayed failed", "segments", len(unmarked), "err", err)
			return
		}
		e.reportRelayed(marked, ready)
	}
	if !e.cfg.EvictOnRelay {
		return
	}
	for _, m := range ready {
		e.evictRelayed(m)
	}
}

// reportRelayed logs and observes the success of each segment of marked,
// whose relayed marker this process just set; ready holds their met.
// Workers finishing acks of one segment at once all meet its condition;
// only the one whose call set the marker reports the success.
func (e *Executor) reportRelayed(marked []segstore.Entry, ready []met) {
	if len(marked) == 0 {
		return
	}
	byID := map[string]met{}
	for _, m := range ready {
		byID[m.entry.ID] = m
	}
	for _, entry := range marked {
		m := byID[entry.ID]
		e.log.Info("relay success", "segment", entry.ID, "condition", string(e.cfg.Condition), "acks", len(m.acked),
			"acked_peers", m.acked, "required", len(m.required))
		if f := e.cfg.Observer.Relayed; f != nil {
			f(entry.ID)
		}
	}
}

// evictRelayed evicts a segment whose relayed marker is committed; the
// gate re-checks the ledger in the eviction's own transaction.
func (e *Executor) evictRelayed(m met) {
	id := m.entry.ID
	log := e.log.With("segment", id)
	err := e.store.EvictIf(id, e.led.EvictionGate(id, m.required, e.cfg.Condition))
	switch {
	case err == nil:
		log.Info("segment evicted on relay", "bytes", m.entry.Size)
		if f := e.cfg.Observer.Evicted; f != nil {
			f(id, m.entry.Size)
		}
	case errors.Is(err, ledger.ErrEvictionBlocked):
		log.Debug("eviction waits for pending deliveries", "reason", err)
	case errors.Is(err, segstore.ErrNotFound), errors.Is(err, segstore.ErrBusy):
		// Someone else is evicting it; nothing to do.
	default:
		log.Error("evict on relay failed", "err", err)
	}
}
