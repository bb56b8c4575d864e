package sim

import (
	"errors"
	"slices"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// body runs the actor's program against its gated stores.
func (a *actor) body() {
	s := a.sim
	var src relaycore.Store = gate{a: a, caps: s.raw.Source.Capabilities()}
	if s.sc.Loose {
		src = looseGate{gate{a: a, caps: s.raw.Source.Capabilities()}}
	}
	tgt := gate{a: a, target: true, caps: s.raw.Target.Capabilities()}
	h := &relaycore.RelayHandler{
		Source: src, Target: tgt, Budget: s.sc.Budget, Clock: a, Kicker: a,
		ClaimTTL: s.sc.ClaimTTL, BackoffBase: 100 * time.Millisecond, BackoffMax: s.sc.BackoffMax,
		RetryBase: 100 * time.Millisecond, RetryMax: s.sc.BackoffMax,
		QuarantineAfter: s.sc.QuarantineAfter, IdleTargetTTL: s.sc.IdleTTL,
	}
	if len(s.sc.hookObs) > 0 {
		h.Hook = relaycore.HolderRelayHook{Prefix: hookPrefix, Observations: s.sc.hookObs}
	}
	switch a.kind {
	case kindWriter, kindLeaseWriter:
		h.SkewMargin, h.PageBytes = s.sc.SkewMargin, s.sc.PageBytes
		a.write(h)
	case kindAlarm:
		ar, err := h.Alarm(s.ctx, a.source)
		s.res.Collected += ar.TargetsCollected
		a.engineError("alarm", err)
	case kindFire:
		_, err := h.Fire(s.ctx, a.source)
		a.engineError("fire", err)
	case kindDeclare:
		a.engineError("declare lease required", relaycore.DeclareLeaseRequired(s.ctx, src, a.source))
	case kindDrain:
		a.drain(h)
	case kindOperator:
		a.operate(h)
	}
}

const hookPrefix = "h/"

// engineError reports errors that no fault of the simulated world
// explains. Contention, injected failures and ambiguous outcomes are the
// world's; a corrupt record is the engine's.
func (a *actor) engineError(op string, err error) {
	if errors.Is(err, relaycore.ErrCorruptRecord) || errors.Is(err, relaycore.ErrInvalidBatch) ||
		errors.Is(err, relaycore.ErrBatchTooLarge) || errors.Is(err, relaycore.ErrValueTooLarge) {
		a.sim.violate("%s %s by %s: %v", op, a.source, a.name, err)
	}
}

// write commits the writer plan's batches, one h.Enqueue each. The
// plan's position advances before the call, so a replacement after a
// crash does not send the interrupted batch again (its rows may or may not
// have been committed; the process that knew is gone).
func (a *actor) write(h *relaycore.RelayHandler) {
	s := a.sim
	wp := a.plan
	st := h.Source
	tries := 0
	for wp.next < len(wp.batches) && s.ph == chaos {
		b := wp.batches[wp.next]
		if b.sleepMS > 0 && tries == 0 {
			a.sleep(s.now + b.sleepMS)
			if s.ph != chaos {
				return
			}
		}
		if wp.lease {
			ok := a.holdLease(st)
			if !ok {
				tries++
				if tries > 6 {
					wp.next, tries = wp.next+1, 0
				}
				a.sleep(s.now + 300 + int64(s.rng.IntN(2500)))
				continue
			}
		}
		wp.next++
		tries = 0
		a.call++
		var deadline time.Time
		a.deadline = 0
		if b.deadlineMS > 0 {
			deadline = a.Now().Add(time.Duration(b.deadlineMS) * time.Millisecond)
			a.deadline = deadline.UnixMilli()
		}
		res, err := h.Enqueue(s.ctx, a.source, b.rows, relaycore.EnqueueOptions{Lease: a.lease, Deadline: deadline})
		s.chk.commitReturned(a, b.rows, res, err)
		if errors.Is(err, relaycore.ErrStaleLease) {
			a.lease = nil
		}
	}
}

// holdLease makes sure a holds a lease it believes live, acquiring or
// sometimes renewing it. It reports false when the lease is held elsewhere.
func (a *actor) holdLease(st relaycore.Store) bool {
	s := a.sim
	now := a.Now()
	if a.lease != nil && a.lease.ExpiresMS-s.sc.SkewMargin.Milliseconds() > now.UnixMilli() {
		if s.rng.IntN(4) > 0 {
			return true
		}
		l, err := relaycore.RenewLease(s.ctx, st, a.source, *a.lease, s.sc.LeaseTTL, now)
		if err != nil {
			a.lease = nil
			a.engineError("renew lease", err)
			return false
		}
		a.lease = &l
		return true
	}
	l, err := relaycore.AcquireLease(s.ctx, st, a.source, a.name, s.sc.LeaseTTL, now)
	if err != nil {
		a.lease = nil
		a.engineError("acquire lease", err)
		return false
	}
	a.lease = &l
	return true
}

// drain fires every source until only permanently failing targets' rows
// remain, then runs one more alarm on each empty source so its durable
// alarm is cleared.
func (a *actor) drain(h *relaycore.RelayHandler) {
	s := a.sim
	pause := s.sc.ClaimTTL.Milliseconds() + s.sc.BackoffMax.Milliseconds() + s.sc.maxSkewMS + 1000
	for round := 0; round < maxDrainRounds && !s.chk.drained(); round++ {
		s.res.QuiesceRounds++
		for _, src := range s.sc.Sources {
			a.releaseQuarantined(h, src)
			ar, err := h.Alarm(s.ctx, src)
			s.res.Collected += ar.TargetsCollected
			a.engineError("alarm", err)
		}
		a.sleep(s.now + pause)
	}
	// A fire that crashed during the chaos may still hold its claim even
	// when the outbox is already drained; let every claim lapse first, as
	// the sweeper's next run would, so the final alarm is not turned away
	// as busy.
	a.sleep(s.now + pause)
	for _, src := range s.sc.Sources {
		if len(s.chk.src[src].rows) != 0 {
			continue
		}
		for try := 0; try < 3; try++ {
			ar, err := h.Alarm(s.ctx, src)
			s.res.Collected += ar.TargetsCollected
			a.engineError("final alarm", err)
			if !ar.Busy {
				break
			}
			a.sleep(s.now + pause)
		}
	}
	s.drained = s.chk.drained()
}

// maxDrainRounds bounds the drain. A scenario's whole workload fits in far
// fewer rounds unless a healthy target is starved, which is a violation.
const maxDrainRounds = 1500

// releaseQuarantined is the operator after an outage: every quarantined
// target of src is released (one that still fails returns to quarantine)
// and every paused one resumed.
func (a *actor) releaseQuarantined(h *relaycore.RelayHandler, src relaycore.Partition) {
	s := a.sim
	ts, _, err := relaycore.ListTargets(s.ctx, h.Source, src, relaycore.TargetFilter{Limit: 1000}, a.Now())
	if err != nil {
		a.engineError("list targets", err)
		return
	}
	for _, t := range ts {
		switch t.State {
		case relaycore.StateQuarantined:
			_, err = h.Release(s.ctx, src, t.Target, relaycore.Actor{By: a.name, Reason: "drain"})
		case relaycore.StatePaused:
			_, err = h.Resume(s.ctx, src, t.Target, relaycore.Actor{By: a.name, Reason: "drain"})
		default:
			continue
		}
		a.opError("release", err)
	}
}

// opError reports an operator action's error unless the world explains it:
// a busy source, a target in another state, an unknown target, a skip
// whose expectation no longer holds or that is too large.
func (a *actor) opError(op string, err error) {
	for _, ok := range []error{relaycore.ErrSourceBusy, relaycore.ErrWrongState, relaycore.ErrUnknownTarget,
		relaycore.ErrSkipConflict, relaycore.ErrSkipRange, relaycore.ErrSkipTooLarge, relaycore.ErrContention,
		relaycore.ErrLeaseRequired} {
		if errors.Is(err, ok) {
			return
		}
	}
	a.engineError(op, err)
}

// operate is an operator at a random moment: quarantine, pause, release or
// resume a target, skip its first held rows (knowing them), or skip with a
// stale expectation (a skip raced by delivery), which must fail cleanly,
// or requeue an archive entry.
func (a *actor) operate(h *relaycore.RelayHandler) {
	s := a.sim
	src := a.source
	t := s.sc.Targets[s.rng.IntN(len(s.sc.Targets))]
	who := relaycore.Actor{By: a.name, Reason: "sim"}
	var err error
	s.res.OpActions++
	defer func() {
		if err == nil {
			s.res.OpApplied++
		}
	}()
	switch s.rng.IntN(9) {
	case 6, 7:
		// The poison-row flow on a target with pending rows: quarantine,
		// let fires hold its rows, skip the first held ones (or try with a
		// stale view), release.
		var ts []relaycore.TargetStatus
		if ts, _, err = relaycore.ListTargets(s.ctx, h.Source, src, relaycore.TargetFilter{State: relaycore.StateActive, Limit: 100}, a.Now()); err != nil {
			break
		}
		if ts = slices.DeleteFunc(ts, func(st relaycore.TargetStatus) bool { return st.Pending == 0 }); len(ts) > 0 {
			t = ts[s.rng.IntN(len(ts))].Target
		}
		if _, err = h.Quarantine(s.ctx, src, t, who); err != nil {
			break
		}
		a.sleep(s.now + 500 + int64(s.rng.IntN(3000)))
		skipped := s.res.Skipped
		var st relaycore.TargetStatus
		if st, err = relaycore.GetTarget(s.ctx, h.Source, src, t); err == nil && st.Held > 0 {
			err = a.skip(h, src, st)
			a.opError("skip", err)
		}
		a.sleep(s.now + 200 + int64(s.rng.IntN(2000)))
		if _, err = h.Release(s.ctx, src, t, who); err == nil && s.res.Skipped > skipped && s.rng.IntN(2) == 0 {
			err = a.requeue(h, src) // the cause is fixed: the skipped rows go again
		}
	case 0:
		_, err = h.Quarantine(s.ctx, src, t, who)
	case 1:
		_, err = h.Pause(s.ctx, src, t, who)
	case 2:
		_, err = h.Release(s.ctx, src, t, who)
	case 3:
		_, err = h.Resume(s.ctx, src, t, who)
	case 4, 5:
		// An operator skips where rows are held: pick among those targets.
		var ts []relaycore.TargetStatus
		if ts, _, err = relaycore.ListTargets(s.ctx, h.Source, src, relaycore.TargetFilter{Limit: 100}, a.Now()); err != nil {
			break
		}
		ts = slices.DeleteFunc(ts, func(st relaycore.TargetStatus) bool { return st.Held == 0 || st.State == relaycore.StateActive })
		if len(ts) == 0 {
			break
		}
		err = a.skip(h, src, ts[s.rng.IntN(len(ts))])
	case 8:
		err = a.requeue(h, src)
	}
	a.opError("operator", err)
}

// requeue enqueues an archive entry's rows again, as an operator who fixed
// their cause, and sometimes at once again, as a retry after a lost answer
// would: the checker holds every requeue of an entry to the seqs its
// first commit got and to one commit of its rows, including a requeue
// after an operator that crashed between the commit and the entry's record
// of the seqs.
func (a *actor) requeue(h *relaycore.RelayHandler, src relaycore.Partition) error {
	s := a.sim
	entries, _, err := relaycore.ListArchive(s.ctx, h.Source, src, 0, 100)
	if err != nil || len(entries) == 0 {
		return err
	}
	e := entries[s.rng.IntN(len(entries))]
	for range 1 + s.rng.IntN(2) {
		a.requeueID = e.ID
		seqs, err := h.Requeue(s.ctx, src, e.ID)
		a.requeueID = 0
		if err != nil {
			return err
		}
		s.chk.requeueReturned(src, e, seqs)
	}
	return nil
}

// skip skips st's first held rows as an operator who read st, sometimes
// with a stale view (a skip raced by delivery), and once more with the
// first seq the refusal names.
func (a *actor) skip(h *relaycore.RelayHandler, src relaycore.Partition, st relaycore.TargetStatus) error {
	s := a.sim
	first := st.FirstSeq
	if s.rng.IntN(6) == 5 { // raced: the operator's view is stale
		first += uint64(1 + s.rng.IntN(2))
	}
	req := relaycore.SkipRequest{Target: st.Target, ExpectFirst: first, Through: min(st.HeldLast, first+uint64(s.rng.IntN(3))),
		Actor: relaycore.Actor{By: a.name, Reason: "sim poison"}}
	res, err := h.Skip(s.ctx, src, req)
	var conflict *relaycore.SkipConflictError
	if errors.As(err, &conflict) && conflict.Actual != 0 && s.rng.IntN(2) == 0 {
		req.ExpectFirst, req.Through = conflict.Actual, max(conflict.Actual, req.Through)
		res, err = h.Skip(s.ctx, src, req)
	}
	if err == nil {
		s.res.Skipped += res.Rows
		if res.First != req.ExpectFirst || res.Last > req.Through || res.Rows == 0 {
			s.violate("skip %s/%s %d..%d archived %d rows %d..%d", src, st.Target, req.ExpectFirst, req.Through, res.Rows, res.First, res.Last)
		}
	}
	return err
}
