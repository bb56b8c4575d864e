package relay

import (
	"errors"
	"fmt"

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
// (PruneMissing), retry-ready failures are rescheduled (RescheduleReady),
// every stored segment gets a record for each required peer that has none,
// and every stored segment's success condition is re-checked: a relayed
// marker or an eviction interrupted by a crash is completed, and a relayed
// marker the condition no longer supports (known_peers grew, so the new
// peer does not hold the segment yet) is cleared. Only here can the
// condition go from met to unmet: at run time the required peers are
// fixed and Acked records stay Acked, so the check cannot race a worker.
// Finally retention is applied (PruneSettled).
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
	entries, err := e.store.List()
	if err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	rep.Segments = len(entries)
	for _, entry := range entries {
		created, err := e.led.EnsureScheduled(entry.ID, e.RequiredPeers(entry), now)
		if err != nil {
			return rep, fmt.Errorf("reconcile: %w", err)
		}
		rep.Scheduled += len(created)
	}
	for _, entry := range entries {
		if entry.Relayed {
			n, err := e.unrelayIfUnmet(entry)
			if err != nil {
				return rep, fmt.Errorf("reconcile: %w", err)
			}
			rep.Unrelayed += n
		}
		e.checkSuccessCondition(entry.ID)
	}
	if rep.Removed, err = e.PruneSettled(); err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	e.Kick()
	return rep, nil
}

// unrelayIfUnmet clears entry's relayed marker when its success condition
// no longer holds, and reports 1 if it did.
func (e *Executor) unrelayIfUnmet(entry segstore.Entry) (int, error) {
	required := e.RequiredPeers(entry)
	a, err := e.led.Assurance(entry.ID, required, e.cfg.Condition)
	if err != nil || a.Met {
		return 0, err
	}
	cleared, err := e.store.ClearRelayed(entry.ID)
	if err != nil || !cleared {
		return 0, err
	}
	e.log.Info("relayed marker cleared: success condition no longer met", "segment", entry.ID,
		"condition", string(e.cfg.Condition), "acked_peers", a.AckedPeers, "required", required)
	return 1, nil
}
