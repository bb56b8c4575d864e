package relay

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// ReconcileReport says what start-up reconciliation changed.
type ReconcileReport struct {
	ledger.RecoveryReport
	// Scheduled counts records created for stored segments that lacked
	// one (a crash between storing and scheduling, or a peer added to
	// known_peers).
	Scheduled int
	// Segments is the number of stored segments examined.
	Segments int
	// Removed counts records removed by retention (PruneSettled).
	Removed int
	// Unrelayed counts stored segments whose relayed marker was cleared
	// because the success condition no longer holds over their required
	// peers (a peer was added to known_peers).
	Unrelayed int
}

// Reconcile repairs the ledger before the workers start: abandoned
// in-flight attempts become failed attempts (InflightToFailed),
// non-terminal records of segments no longer stored are deadlettered
// (PruneMissing), records deferred by the previous process's dial
// circuits get their due time back (ReleaseDeferred), retry-ready failures
// are rescheduled (RescheduleReady), every stored segment gets a record for each required peer that has none,
// and every stored segment's success condition is re-checked: a relayed
// marker or an eviction interrupted by a crash is completed, and a relayed
// marker the condition no longer supports (known_peers grew, so the new
// peer does not hold the segment yet) is cleared. Only here can the
// condition go from met to unmet: at run time the required peers are
// fixed and Acked records stay Acked, so the check cannot race a worker.
// The stored segments are read and handled reconcileBatch at a time, each
// batch in a few transactions. Finally retention is applied (PruneSettled).
// Idempotent; run it once after opening the store and before Run.
func (e *Executor) Reconcile() (ReconcileReport, error) {
	var rep ReconcileReport
	now := e.cfg.Now()
	var err error
	if rep.RecoveryReport, err = e.led.Recover(now, e.cfg.Policy, e.store.Held); err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	for after := ""; ; {
		chunk, err := e.store.ListAfter(after, e.reconcileBatch)
		if err != nil {
			return rep, fmt.Errorf("reconcile: %w", err)
		}
		if len(chunk) == 0 {
			break
		}
		rep.Segments += len(chunk)
		scheduled, unrelayed, err := e.reconcileChunk(chunk, now)
		rep.Scheduled += scheduled
		rep.Unrelayed += unrelayed
		if err != nil {
			return rep, fmt.Errorf("reconcile: %w", err)
		}
		after = chunk[len(chunk)-1].ID
	}
	if rep.Removed, err = e.PruneSettled(); err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	e.Kick()
	return rep, nil
}

// reconcileBatch is how many stored segments reconciliation reads the
// ledger for, and schedules and clears relayed markers for, per
// transaction. Once per segment cost a
// commit (two fsyncs) for every segment owed to a new peer: after a peer
// was added, or the database rebuilt, 10,000 segments took 2.7-2.8 s to
// start. A batch bounds what one transaction holds (a few hundred KB of
// dirty pages at 1024 segments and a handful of peers) and how much of the
// index is in memory at once.
const reconcileBatch = 1024

// reconcileChunk reads the ledger's standing of every segment of chunk
// (one read transaction), then, when anything is to change, gives each
// segment a record for every required peer that has none, clears the
// relayed markers the success condition no longer supports and sets those
// it newly supports, all in one write transaction; then it evicts what
// the condition allows (evict_on_relay). The chunk's entries are as fresh
// as that: nothing else writes before the workers and the listener start.
// It returns how many records it created and markers it cleared.
func (e *Executor) reconcileChunk(chunk []segstore.Entry, now time.Time) (scheduled, unrelayed int, err error) {
	owed := make([]ledger.Owed, len(chunk))
	for i, entry := range chunk {
		owed[i] = ledger.Owed{SegmentID: entry.ID, PeerIDs: e.RequiredPeers(entry)}
	}
	standing, err := e.led.StandingAll(owed, e.cfg.Condition)
	if err != nil {
		return 0, 0, err
	}
	var missing []ledger.Owed
	var unmet, unmarked []string
	var ready []met
	for i, entry := range chunk {
		st := standing[i]
		if len(st.Unrecorded) > 0 {
			missing = append(missing, ledger.Owed{SegmentID: entry.ID, PeerIDs: st.Unrecorded})
		}
		switch {
		case entry.Relayed && !st.Met:
			unmet = append(unmet, entry.ID)
		case !entry.Relayed && st.Met:
			unmarked = append(unmarked, entry.ID)
		}
		if st.Met {
			ready = append(ready, met{entry: entry, required: owed[i].PeerIDs, acked: st.AckedPeers})
		}
	}
	if len(missing)+len(unmet)+len(unmarked) > 0 {
		var created []ledger.Pair
		cleared, marked, err := e.store.UpdateRelayed(unmet, unmarked, func(tx *bolt.Tx) (err error) {
			created, err = e.led.EnsureScheduledIn(tx, missing, now)
			return err
		})
		if err != nil {
			return 0, 0, err
		}
		scheduled, unrelayed = len(created), len(cleared)
		e.logCleared(cleared, owed, standing, chunk)
		e.reportRelayed(marked, ready)
	}
	if e.cfg.EvictOnRelay {
		for _, m := range ready {
			e.evictRelayed(m)
		}
	}
	return scheduled, unrelayed, nil
}

// logCleared logs the relayed markers reconcileChunk cleared: each at
// debug, and one line per batch at info (a peer added to a node holding
// 10,000 segments clears 10,000 markers, and one line each drowned the
// start's log).
func (e *Executor) logCleared(cleared []segstore.Entry, owed []ledger.Owed, standing []ledger.Standing, chunk []segstore.Entry) {
	if len(cleared) == 0 {
		return
	}
	i := 0
	for _, c := range cleared {
		for chunk[i].ID != c.ID { // cleared is in chunk order
			i++
		}
		e.log.Debug("relayed marker cleared: success condition no longer met", "segment", c.ID,
			"condition", string(e.cfg.Condition), "acked_peers", standing[i].AckedPeers, "required", owed[i].PeerIDs)
	}
	e.log.Info("relayed markers cleared: success condition no longer met", "segments", len(cleared),
		"first", cleared[0].ID, "last", cleared[len(cleared)-1].ID, "condition", string(e.cfg.Condition))
}
