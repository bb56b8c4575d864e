package relay

import (
	"errors"
	"fmt"
	"time"

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
	var statErr error
	exists := func(id string) bool {
		_, err := e.store.Stat(id)
		if err != nil && !errors.Is(err, segstore.ErrNotFound) && statErr == nil {
			statErr = err
		}
		// On a read error, claim the segment exists: deadlettering live
		// work because of a transient error would be worse.
		return !errors.Is(err, segstore.ErrNotFound)
	}
	var err error
	if rep.RecoveryReport, err = e.led.Recover(now, e.cfg.Policy, exists); err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	if statErr != nil {
		return rep, fmt.Errorf("reconcile: %w", statErr)
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

// reconcileBatch is how many stored segments reconciliation schedules,
// and clears relayed markers for, per transaction. Once per segment cost a
// commit (two fsyncs) for every segment owed to a new peer: after a peer
// was added, or the database rebuilt, 10,000 segments took 2.7-2.8 s to
// start. A batch bounds what one transaction holds (a few hundred KB of
// dirty pages at 1024 segments and a handful of peers) and how much of the
// index is in memory at once.
const reconcileBatch = 1024

// reconcileChunk gives every segment of chunk a record for each required
// peer that has none (one transaction), clears the relayed markers the
// success condition no longer supports (one transaction), and then
// completes what the condition calls for (markers, evictions). It returns
// how many records it created and markers it cleared.
func (e *Executor) reconcileChunk(chunk []segstore.Entry, now time.Time) (scheduled, unrelayed int, err error) {
	owed := make([]ledger.Owed, len(chunk))
	ids := make([]string, len(chunk))
	for i, entry := range chunk {
		owed[i] = ledger.Owed{SegmentID: entry.ID, PeerIDs: e.RequiredPeers(entry)}
		ids[i] = entry.ID
	}
	created, err := e.led.EnsureScheduledAll(owed, now)
	if err != nil {
		return 0, 0, err
	}
	if unrelayed, err = e.unrelayUnmet(chunk); err != nil {
		return len(created), 0, err
	}
	e.checkSuccessConditions(ids)
	return len(created), unrelayed, nil
}

// unrelayUnmet clears the relayed marker of every entry of chunk whose
// success condition no longer holds, in one transaction, and returns how
// many it cleared.
func (e *Executor) unrelayUnmet(chunk []segstore.Entry) (int, error) {
	type why struct {
		acked, required []string
	}
	var unmet []string
	whys := map[string]why{}
	for _, entry := range chunk {
		if !entry.Relayed {
			continue
		}
		required := e.RequiredPeers(entry)
		a, err := e.led.Assurance(entry.ID, required, e.cfg.Condition)
		if err != nil {
			return 0, err
		}
		if !a.Met {
			unmet = append(unmet, entry.ID)
			whys[entry.ID] = why{a.AckedPeers, required}
		}
	}
	if len(unmet) == 0 {
		return 0, nil
	}
	cleared, err := e.store.ClearRelayedAll(unmet)
	if err != nil {
		return 0, err
	}
	// One line per batch: a peer added to a node holding 10,000 segments
	// clears 10,000 markers, and one line each drowned the start's log.
	for _, id := range cleared {
		e.log.Debug("relayed marker cleared: success condition no longer met", "segment", id,
			"condition", string(e.cfg.Condition), "acked_peers", whys[id].acked, "required", whys[id].required)
	}
	if len(cleared) > 0 {
		e.log.Info("relayed markers cleared: success condition no longer met", "segments", len(cleared),
			"first", cleared[0], "last", cleared[len(cleared)-1], "condition", string(e.cfg.Condition))
	}
	return len(cleared), nil
}
