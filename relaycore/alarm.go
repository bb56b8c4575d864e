package relaycore

import (
	"bytes"
	"context"
	"fmt"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Alarm handles one alarm for source: up to FiresPerAlarm fires (stopping
// early when a fire makes no progress or the outbox is drained), then either
// deletes the alarm record, when the outbox is empty, guarded on os and the
// alarm being unchanged so an append landing meanwhile keeps its wake-up, or
// re-arms it (due now after progress, back-off after none) and kicks.
func (h *RelayHandler) Alarm(ctx context.Context, source Partition) (AlarmResult, error) {
	if err := h.needStores("Alarm", true); err != nil {
		return AlarmResult{}, err
	}
	b := h.budget()
	token := newNonce()
	var ar AlarmResult
	var last FireResult
	memo := &goneMemo{}
	for i := 0; i < b.FiresPerAlarm; i++ {
		// Fires after the first find the claim the one before kept: the
		// loop goes on only after a fire that continued, which keeps it.
		fr, err := h.fire(ctx, source, token, i < b.FiresPerAlarm-1, i > 0, memo)
		ar.add(fr)
		if err != nil {
			return ar, err
		}
		if fr.Busy {
			// The holder re-arms the alarm when it ends; one that crashed
			// cannot, so wake the source when its claim lapses.
			ar.Busy, ar.BusyRetryMS = true, fr.BusyRetryMS
			if fr.BusyRetryMS > 0 {
				h.kick(ctx, source, fr.BusyRetryMS)
			}
			return ar, nil
		}
		last = fr
		ar.Progress, ar.More = fr.Progress, fr.More
		if !fr.continues() {
			break
		}
	}
	// Idle targets' figures go while the source is between fires (a
	// sweep at most every eighth of IdleTargetTTL); a failed sweep only
	// leaves them for the next.
	n, err := h.collectIdle(ctx, source, last)
	if err != nil {
		loggerOr(h.Logger).Warn("relay idle-target collection failed; the next alarm tries again", "source", string(source), "err", err)
	}
	ar.TargetsCollected = n
	return ar, h.rearm(ctx, source, last, &ar, memo)
}

// continues is the one rule, shared by the fire (to keep or release its
// claim) and Alarm (to run another fire), for going on within an alarm.
func (f FireResult) continues() bool { return f.More && f.Progress }

func (h *RelayHandler) rearm(ctx context.Context, source Partition, last FireResult, ar *AlarmResult, memo *goneMemo) error {
	for attempt := 0; attempt < 4; attempt++ {
		// rs, os and the alarm before the outbox and the retry markers: a
		// fire or operator that puts a retry marker writes rs in the same
		// batch and an append writes os, so the clear below, guarded on
		// these, cannot strand a marker or rows put after they were read.
		// One GetMany (one call on every store) rather than three Gets.
		var v alarmView
		head, err := GetMany(ctx, h.Source, source, []string{KeyRS, KeyOS, KeyAlarm})
		if err != nil {
			return fmt.Errorf("alarm %s: read rs, os and alarm: %w", source, err)
		}
		v.rsRaw, v.rsFound = head[KeyRS]
		v.osRaw, v.osFound = head[KeyOS]
		v.alarmRaw, v.alarmFound = head[KeyAlarm]
		// Ghosts (gone.go) are not pages left: delete any this alarm did
		// not, before looking.
		if v.gone, err = h.rsGhostsDeleted(ctx, source, v.rsRaw, v.rsFound, memo); err != nil {
			return fmt.Errorf("alarm %s: %w", source, err)
		}
		first, err := outboxHead(ctx, h.Source, source)
		if err != nil {
			return fmt.Errorf("alarm %s: %w", source, err)
		}
		empty := first == nil
		if empty {
			// Held rows that are due later keep the source's wake-up.
			if due, ok, err := firstRetry(ctx, h.Source, source); err != nil {
				return fmt.Errorf("alarm %s: %w", source, err)
			} else if ok {
				last.NextDueMS = max(due, unixMS(h.clock().Now()))
				empty = false
			}
		}
		var again bool
		if empty {
			// Rows of quarantined or paused targets wake nothing but are
			// undelivered: their bound stays (SourceRelayState's too).
			ar.LowerBoundMS = 0
			if last.Hold.HeldRows > 0 {
				ar.LowerBoundMS = h.lowerBound(nil, v, last)
			}
			again, err = h.clearAlarm(ctx, source, v, ar)
		} else {
			ar.LowerBoundMS = h.lowerBound(first, v, last)
			again, err = h.rearmAt(ctx, source, v, committedSince(last, v), ar)
		}
		if !again {
			return err
		}
	}
	return fmt.Errorf("alarm %s: clear: %w", source, ErrContention)
}

// committedSince returns last with no back-off (NextDueMS 0: due now)
// when rows were committed after the fire read os: their enqueuers found
// the alarm due, kept it and left the wake-up to this re-arm (docs/engine.md,
// Enqueue), so a back-off chosen for the fire's failing targets must not
// postpone them.
func committedSince(last FireResult, v alarmView) FireResult {
	if os, err := decodeOS(v.osRaw, v.osFound); err == nil && last.sawNextSeq > 0 && os.NextSeq > last.sawNextSeq {
		last.NextDueMS = 0
	}
	return last
}

// alarmView is what rearm read of the source: rs, os and the alarm as
// stored, and the ghosts it deleted.
type alarmView struct {
	rsRaw, osRaw, alarmRaw       []byte
	rsFound, osFound, alarmFound bool
	gone                         []string
}

// clearAlarm deletes the alarm of a source whose outbox rearm found empty,
// guarded on rs, os and the alarm as read. again: something got in
// meanwhile (an append, another alarm); look again.
func (h *RelayHandler) clearAlarm(ctx context.Context, source Partition, v alarmView, ar *AlarmResult) (again bool, err error) {
	if !v.alarmFound {
		ar.Cleared = true
		return false, nil
	}
	if h.looseDeleter() != nil {
		return h.clearSingles(ctx, source, v, ar)
	}
	// The clear writes os (osBump): an enqueue that kept the alarm as due
	// fails its os guard and arms a new one.
	osPre, osW, err := osBump(v.osRaw, v.osFound)
	if err != nil {
		return false, fmt.Errorf("alarm %s: %w", source, err)
	}
	caps := h.Source.Capabilities()
	gcPre, gcDel, err := expiredIdem(ctx, h.Source, source, unixMS(h.clock().Now()), 3,
		caps.ItemSize(source, KeyAlarm, 0)+caps.ItemSize(source, KeyRS, len(v.rsRaw))+caps.ItemSize(source, KeyOS, len(osW.Value)))
	if err != nil {
		return false, fmt.Errorf("alarm %s: %w", source, err)
	}
	rsPre := Precondition{Key: KeyRS, Absent: true}
	if v.rsFound {
		rsPre = Precondition{Key: KeyRS, Value: v.rsRaw}
	}
	writes := []Write{{Key: KeyAlarm, Delete: true}, osW}
	if len(v.gone) > 0 {
		// The guard on rs becomes a write of it without the list (the
		// ghosts are deleted): the same units, and the next claim has
		// nothing to look for.
		if w, err := rsWithoutGone(v.rsRaw); err == nil {
			writes = append(writes, w)
		}
	}
	err = h.Source.Apply(ctx, source, Batch{
		Preconditions: append([]Precondition{osPre, {Key: KeyAlarm, Value: v.alarmRaw}, rsPre}, gcPre...),
		Writes:        append(writes, gcDel...),
	})
	if err == nil {
		ar.Cleared = true
		return false, nil
	}
	if _, ok := FailedPrecondition(err); ok || MayBeApplied(err) {
		return true, nil
	}
	return false, fmt.Errorf("alarm %s: clear: %w", source, err)
}

// rearmAt re-arms the alarm of a source with rows left: due now after
// progress, else at the fire's back-off or its earliest retry, and kicks.
// A back-off (due past now) writes os too (osBump), so an enqueue that kept
// the alarm as due is re-planned rather than left behind the back-off.
// again: an expired idempotency record or os changed meanwhile.
func (h *RelayHandler) rearmAt(ctx context.Context, source Partition, v alarmView, last FireResult, ar *AlarmResult) (again bool, err error) {
	nowMS := unixMS(h.clock().Now())
	due := last.NextDueMS
	if due == 0 {
		due = nowMS
	}
	if r := last.NextRetryMS; r > 0 && r < due {
		due = max(r, nowMS)
	}
	pre := Precondition{Key: KeyAlarm, Absent: true}
	if v.alarmFound {
		pre = Precondition{Key: KeyAlarm, Value: v.alarmRaw}
		if a, err := decodeAlarm(v.alarmRaw); err == nil && a.DueMS == due {
			ar.NextDueMS = due
			h.kick(ctx, source, due)
			return false, nil
		}
	}
	aw := alarmWrite(due)
	batch := Batch{Preconditions: []Precondition{pre}, Writes: []Write{aw}}
	fixed := h.Source.Capabilities().ItemSize(source, KeyAlarm, len(aw.Value))
	if due > nowMS {
		osPre, osW, err := osBump(v.osRaw, v.osFound)
		if err != nil {
			return false, fmt.Errorf("alarm %s: %w", source, err)
		}
		batch.Preconditions, batch.Writes = append(batch.Preconditions, osPre), append(batch.Writes, osW)
		fixed += h.Source.Capabilities().ItemSize(source, KeyOS, len(osW.Value))
	}
	gcPre, gcDel, err := expiredIdem(ctx, h.Source, source, nowMS, len(batch.Writes), fixed)
	if err != nil {
		return false, fmt.Errorf("alarm %s: %w", source, err)
	}
	batch.Preconditions, batch.Writes = append(batch.Preconditions, gcPre...), append(batch.Writes, gcDel...)
	err = h.Source.Apply(ctx, source, batch)
	if i, ok := FailedPrecondition(err); ok && i > 0 {
		return true, nil // os or an expired idempotency record changed meanwhile: look again
	}
	if _, ok := FailedPrecondition(err); ok {
		return h.rearmedMeanwhile(ctx, source, due, ar)
	}
	if err != nil && !MayBeApplied(err) {
		return false, fmt.Errorf("alarm %s: re-arm: %w", source, err)
	}
	if err != nil {
		loggerOr(h.Logger).Warn("relay alarm re-arm outcome unknown; the old alarm or the sweeper covers it", "source", string(source), "err", err)
	}
	ar.NextDueMS = due
	h.kick(ctx, source, due)
	return false, nil
}

// rearmedMeanwhile settles a re-arm at due that found the alarm changed
// since rearm read it: an enqueue armed it due at its commit, or another
// fire re-armed it (a fast kick's fire that found nothing left, backing
// off, between two alarms of a draining invocation). Theirs is kept when
// it is due no later than ours, and reported as the alarm's due time, so
// an alarm that made progress still sees its source due now and goes on
// (lambda/fire continues on it); whoever armed it kicked for it. One due
// later than ours (a back-off that did not see our progress) is not kept:
// rearm looks again and re-arms at ours (again).
func (h *RelayHandler) rearmedMeanwhile(ctx context.Context, source Partition, due int64, ar *AlarmResult) (again bool, err error) {
	raw, found, err := h.Source.Get(ctx, source, KeyAlarm)
	if err != nil {
		return false, fmt.Errorf("alarm %s: re-arm: read the alarm: %w", source, err)
	}
	if !found {
		return true, nil // cleared meanwhile: look at the outbox again
	}
	a, err := decodeAlarm(raw)
	if err != nil {
		return false, fmt.Errorf("alarm %s: %w", source, err)
	}
	if a.DueMS > due {
		return true, nil
	}
	ar.NextDueMS = a.DueMS
	return false, nil
}

func (h *RelayHandler) kick(ctx context.Context, source Partition, due int64) {
	if h.Kicker == nil {
		return
	}
	if err := kickBounded(ctx, h.Kicker, source, due); err != nil {
		loggerOr(h.Logger).Warn("relay kick failed; the durable alarm still holds", "source", string(source), "due_ms", due, "err", err)
	}
}

// outboxHead returns source's first row page, nil when it has none.
func outboxHead(ctx context.Context, st Store, source Partition) (*Item, error) {
	after := ""
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: layout.PagePrefix, End: layout.PageEnd, After: after, Limit: 1})
		if err != nil {
			return nil, fmt.Errorf("scan pages %s: %w", source, err)
		}
		if len(pg.Items) > 0 {
			return &pg.Items[0], nil
		}
		if pg.Next == "" {
			return nil, nil
		}
		after = pg.Next
	}
}

// lowerBound is AlarmResult.LowerBoundMS for a re-arm that found first
// (nil: the outbox is empty, held rows keep the alarm) with v read: what
// SourceRelayState would answer (undeliveredLowerBound), from what the
// re-arm read anyway, with held rows as the last fire left the hold
// summary. 0: unknown.
func (h *RelayHandler) lowerBound(first *Item, v alarmView, last FireResult) int64 {
	var pageMS int64
	if first != nil {
		var err error
		if _, pageMS, err = pageHeader(first.Key, first.Value); err != nil {
			return 0
		}
	}
	os, err := decodeOS(v.osRaw, v.osFound)
	if err != nil {
		return 0
	}
	lower := undeliveredLowerBound(first != nil, pageMS, os.LastCommitMS, last.Hold)
	return max(min(lower, unixMS(h.clock().Now())), 0)
}

// firstRetry returns the due time of source's earliest retry marker.
func firstRetry(ctx context.Context, st Store, source Partition) (int64, bool, error) {
	after := ""
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: layout.RetryPrefix, End: layout.RetryEnd, After: after, Limit: 1})
		if err != nil {
			return 0, false, fmt.Errorf("scan retry markers %s: %w", source, err)
		}
		if len(pg.Items) > 0 {
			due, _, err := parseRetryKey(pg.Items[0].Key)
			return due, err == nil, err
		}
		if pg.Next == "" {
			return 0, false, nil
		}
		after = pg.Next
	}
}

// AlarmResult counts one alarm's fires and what it did with the alarm.
type AlarmResult struct {
	Fires int
	// Busy: another fire held the claim; the alarm record was left as is,
	// and the Kicker was asked to wake the source again at BusyRetryMS
	// (when the claim met lapses; see FireResult.BusyRetryMS), so a claim
	// left by a fire that crashed delays the source by ClaimTTL, not by a
	// sweep.
	Busy          bool
	BusyRetryMS   int64
	RowsInspected int
	RowsDelivered int
	RowsCleaned   int
	TargetCalls   int
	TargetReads   int
	// TargetsBlock counts targets that joined the blocked set.
	TargetsBlock int
	// TargetsHeld, TargetsQuarantined, RowsHeld, TargetsRedriven: sums of
	// the fires' figures.
	TargetsHeld, TargetsQuarantined, RowsHeld, TargetsRedriven int
	// Blocked is the blocked set's size and Hold the hold summary after
	// the alarm's last fire (zero when busy).
	Blocked int
	Hold    HoldSummary
	// Cleared: the outbox was empty and the alarm record was deleted.
	Cleared bool
	// TargetsCollected counts idle targets whose figures the alarm
	// collected (RelayHandler.IdleTargetTTL).
	TargetsCollected int
	// Progress: the alarm's last fire made progress (delivered or cleaned
	// rows, or moved its cursor past blocked rows), so the re-armed alarm is
	// due at once; without it the alarm was re-armed with back-off.
	// Runtimes use it to decide whether to continue the source right away.
	Progress bool
	// More: the alarm's last fire left rows it had seen (its budget ran
	// out first, or targets are blocked), as FireResult.More; without it
	// the fire finished all it found, and any rows the re-arm found came
	// while the alarm ran. A runtime that batches a busy source's fires
	// (infra/alarmclock's Linger) holds only those: a backlog is fired
	// again at once.
	More bool
	// LowerBoundMS, after an alarm that left undelivered rows (in the
	// outbox, or held: a cleared alarm with quarantined or paused targets'
	// rows has one too), bounds their commit times from below, as
	// SourceRelayState's LowerBoundMS does, from what the re-arm read: a
	// runtime reports the oldest undelivered age without reading the
	// source again. 0 when nothing is left (cleared with nothing held),
	// busy, or unknown.
	LowerBoundMS int64
	// NextDueMS is the re-armed alarm's due time (0 when cleared or busy).
	NextDueMS int64
}

func (a *AlarmResult) add(f FireResult) {
	a.Fires++
	a.RowsInspected += f.RowsInspected
	a.RowsDelivered += f.RowsDelivered
	a.RowsCleaned += f.RowsCleaned
	a.TargetCalls += f.TargetCalls
	a.TargetReads += f.TargetReads
	a.TargetsBlock += f.TargetsBlocked
	a.TargetsHeld += f.TargetsHeld
	a.TargetsQuarantined += f.TargetsQuarantined
	a.RowsHeld += f.RowsHeld
	a.TargetsRedriven += f.TargetsRedriven
	if !f.Busy {
		a.Blocked, a.Hold = f.Blocked, f.Hold
	}
}

// osBump is the guard and write of os (its version bumped) that every
// delete of the alarm and every move of it past its writer's clock carries.
// An enqueue that finds the alarm due keeps it without checking it
// (planEnqueue) and relies on its own os guard to learn that the alarm went
// or moved later; on DynamoDB the bump costs the same units as the check of
// os these batches made before (a transactional item billed on its size).
func osBump(raw []byte, found bool) (Precondition, Write, error) {
	o, err := decodeOS(raw, found)
	if err != nil {
		return Precondition{}, Write{}, err
	}
	o.Version++
	return osGuard(raw, found), Write{Key: KeyOS, Value: encodeJSON(o)}, nil
}

// clearSingles is clearAlarm on a store that bills a transaction twice what
// it bills the same writes sent one by one (a LooseDeleter: DynamoDB). The
// clear's one batch there costs 2 units per item (the alarm's delete and
// the guards on os and rs: 6 and the index entry), about a tenth of a unit
// per row when every 20-row enqueue is cleared after; in three single
// writes it costs half:
//
//  1. os, version bumped and Clearing set, guarded on the os read: an
//     enqueue that read os before fails its guard; one that reads it after
//     rewrites the alarm if it keeps it (planEnqueue).
//  2. the alarm's delete, guarded on the value read: it fails if any
//     enqueue wrote the alarm meanwhile, so no enqueue's rows are left
//     without one. An enqueue of step 1's os that did not write the alarm
//     found it absent, which means this delete happened first.
//  3. rs, read again (or written without the list of ghosts, guarded on
//     the value read, when it lists any, which is what the batch did), and
//     os read again: a retry marker put or an append of an older release
//     (which checks the alarm instead of rewriting it) meanwhile shows
//     here, and the alarm is looked at again and re-armed.
//
// A crash between steps leaves os saying Clearing, which the next enqueue
// resets (it writes the alarm); between 2 and 3 it can miss a retry marker
// that a second alarm's fire put meanwhile if that alarm crashes too before
// its own re-arm. Expired idempotency records are deleted after, in a
// batch of their own when there are any.
func (h *RelayHandler) clearSingles(ctx context.Context, source Partition, v alarmView, ar *AlarmResult) (again bool, err error) {
	o, err := decodeOS(v.osRaw, v.osFound)
	if err != nil {
		return false, fmt.Errorf("alarm %s: %w", source, err)
	}
	o.Version++
	o.Clearing = true
	osAfter := encodeJSON(o)
	err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{osGuard(v.osRaw, v.osFound)}, Writes: []Write{{Key: KeyOS, Value: osAfter}}})
	if again, err := clearStep(source, "mark os", err); again || err != nil {
		return again, err
	}
	err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{{Key: KeyAlarm, Value: v.alarmRaw}}, Writes: []Write{{Key: KeyAlarm, Delete: true}}})
	if again, err := clearStep(source, "delete alarm", err); again || err != nil {
		return again, err
	}
	// The alarm is gone: from here a failure looks again, which re-arms it
	// if anything is left. rs is checked by its guarded rewrite when it
	// lists ghosts, else read again with os.
	reread := []string{KeyOS, KeyRS}
	if len(v.gone) > 0 {
		if w, werr := rsWithoutGone(v.rsRaw); werr == nil {
			if err := h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{{Key: KeyRS, Value: v.rsRaw}}, Writes: []Write{w}}); err != nil {
				return true, nil
			}
			reread = reread[:1]
		}
	}
	now, err := GetMany(ctx, h.Source, source, reread)
	if err != nil {
		return true, nil
	}
	if !bytes.Equal(now[KeyOS], osAfter) {
		return true, nil
	}
	if rs, found := now[KeyRS]; len(reread) > 1 && (found != v.rsFound || !bytes.Equal(rs, v.rsRaw)) {
		return true, nil
	}
	ar.Cleared = true
	if gcPre, gcDel, err := expiredIdem(ctx, h.Source, source, unixMS(h.clock().Now()), 0, 0); err == nil && len(gcDel) > 0 {
		if err := h.Source.Apply(ctx, source, Batch{Preconditions: gcPre, Writes: gcDel}); err != nil {
			loggerOr(h.Logger).Warn("relay idempotency record collection failed; the next clear tries again", "source", string(source), "err", err)
		}
	}
	return false, nil
}

// clearStep classifies a clearSingles step's outcome: a lost guard or an
// outcome unknown looks again (the next look reads what is there).
func clearStep(source Partition, step string, err error) (again bool, _ error) {
	if err == nil {
		return false, nil
	}
	if _, ok := FailedPrecondition(err); ok || MayBeApplied(err) {
		return true, nil
	}
	return false, fmt.Errorf("alarm %s: clear: %s: %w", source, step, err)
}
