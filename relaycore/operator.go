package relaycore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Operator actions on one (source, target): quarantine, release, pause,
// resume and skip. Each takes the source's fire claim first (as a fire
// would), so no fire is running while it reads and writes: a fire that
// started before the action has finished (or its claim has lapsed), and the
// next one sees the new state. A live fire makes the action fail with
// ErrSourceBusy; retrying a moment later is safe.

// Action is an operator action on one target. Each is allowed in some
// target states only (AllowedIn); the engine checks it under the source's
// claim, and a host may ask first to refuse early.
type Action string

// The operator actions.
const (
	// ActionQuarantine holds the target's rows until ActionRelease;
	// allowed from active and paused.
	ActionQuarantine Action = "quarantine"
	// ActionRelease ends a quarantine; allowed from quarantined.
	ActionRelease Action = "release"
	// ActionPause holds the target's rows on purpose until ActionResume;
	// allowed from active.
	ActionPause Action = "pause"
	// ActionResume ends a pause; allowed from paused.
	ActionResume Action = "resume"
	// ActionSkip archives held rows without applying them; allowed from
	// quarantined and paused, and it needs a reason.
	ActionSkip Action = "skip"
)

// actionFrom is the one list of the states each action is allowed in.
var actionFrom = map[Action][]TargetState{
	ActionQuarantine: {StateActive, StatePaused},
	ActionRelease:    {StateQuarantined},
	ActionPause:      {StateActive},
	ActionResume:     {StatePaused},
	ActionSkip:       {StateQuarantined, StatePaused},
}

// AllowedIn reports whether a applies to a target in state s (false for an
// unknown action). An action refused by it fails with a
// *TargetStateError (ErrWrongState).
func (a Action) AllowedIn(s TargetState) bool { return slices.Contains(actionFrom[a], s) }

// check is the engine's state rule for a on target, as a refusal.
func (a Action) check(target Partition, s TargetState) error {
	if !a.AllowedIn(s) {
		return &TargetStateError{Target: target, State: s, Action: a}
	}
	return nil
}

// Actor says who does an operator action and why. Reason is required for
// skips; both are kept in the target's record (and in the archive for a
// skip), bounded by MaxReasonLen and MaxActorLen bytes of UTF-8 without
// control characters.
type Actor struct {
	By     string
	Reason string
}

// Validate checks a as the actor of action, as the engine does before the
// action takes the source's claim: an error wrapping
// ErrInvalidOperatorInput when the reason or actor is too long or not
// text, when a skip has no reason, or when the action is unknown.
func (a Actor) Validate(action Action) error {
	if _, ok := actionFrom[action]; !ok {
		return fmt.Errorf("%w: unknown action %q", ErrInvalidOperatorInput, action)
	}
	switch {
	case len(a.Reason) > MaxReasonLen:
		return fmt.Errorf("%w: reason is %d bytes, limit %d", ErrInvalidOperatorInput, len(a.Reason), MaxReasonLen)
	case len(a.By) > MaxActorLen:
		return fmt.Errorf("%w: actor is %d bytes, limit %d", ErrInvalidOperatorInput, len(a.By), MaxActorLen)
	case action == ActionSkip && a.Reason == "":
		return fmt.Errorf("%w: a reason is required", ErrInvalidOperatorInput)
	case !printable(a.Reason) || !printable(a.By):
		return fmt.Errorf("%w: reason and actor must be UTF-8 text without control characters", ErrInvalidOperatorInput)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// opRun is an operator action holding the source's claim.
type opRun struct {
	h      *RelayHandler
	ctx    context.Context
	source Partition
	now    int64
	start  claimed
	writes []Write
	pre    []Precondition
	q      holdSummary
	kick   bool
	// unfold: targets whose whole record the action writes, so rs drops
	// their folded progress.
	unfold []Partition
}

// operate takes the claim, runs fn, and commits fn's writes with the claim
// released, all guarded on rs as claimed. A commit that loses one of fn's
// own preconditions (an enqueue re-armed the alarm meanwhile) runs fn again
// under the same claim, a few times; an action that fails in the end
// releases its claim on the way out (releaseClaim), so a failed action
// leaves the source free for the next fire or action.
func (h *RelayHandler) operate(ctx context.Context, source Partition, fn func(o *opRun) error) error {
	if err := h.needStores("operator action", false); err != nil {
		return err
	}
	now := unixMS(h.clock().Now())
	token := opTokenPrefix + newNonce()
	start, busy, err := h.claim(ctx, source, token, now, true, nil, claimReads{})
	if err != nil {
		h.releaseClaim(ctx, source, token) // an ambiguous claim write may have landed
		return err
	}
	if busy {
		return fmt.Errorf("%s: %w", source, ErrSourceBusy)
	}
	for attempt := 0; ; attempt++ {
		o, ferr, err := h.operateOnce(ctx, source, start, now, fn)
		i, lost := FailedPrecondition(err)
		if ferr == nil && lost && i > 0 && attempt < 3 {
			continue // fn's precondition, not our claim: read again
		}
		if ferr != nil || err != nil {
			h.releaseClaim(ctx, source, token)
		}
		switch {
		case ferr != nil:
			return ferr
		case lost && i > 0:
			return fmt.Errorf("%s: %w", source, ErrContention)
		case lost:
			// Our claim lapsed and a fire took over: nothing was written.
			return fmt.Errorf("%s: claim lapsed: %w", source, ErrSourceBusy)
		case err != nil:
			return fmt.Errorf("%s: %w", source, err)
		}
		if o.kick {
			h.kick(ctx, source, now)
		}
		return nil
	}
}

// operateOnce runs fn under the claim start and commits: fn's writes when
// it succeeded, the release of the claim alone when it failed (ferr). err
// is the commit's.
func (h *RelayHandler) operateOnce(ctx context.Context, source Partition, start claimed, now int64, fn func(o *opRun) error) (o *opRun, ferr, err error) {
	o = &opRun{h: h, ctx: ctx, source: source, now: now, start: start, q: start.q}
	ferr = fn(o)
	next := start.rs.RelayState
	next.Version++
	next.Claim = nil
	nextRaw := encodeJSON(next)
	writes := []Write{{Key: KeyRS, Value: nextRaw}}
	pre := []Precondition{{Key: KeyRS, Value: start.rsRaw}}
	if ferr == nil && len(o.unfold) > 0 {
		for _, t := range o.unfold {
			next.Targets = unfoldDone(next.Targets, t)
		}
		nextRaw = encodeJSON(next)
		writes[0].Value = nextRaw
	}
	if ferr == nil {
		writes = append(writes, o.writes...)
		pre = append(pre, o.pre...)
		if o.q != start.q {
			o.q.Version++
			writes = append(writes, Write{Key: layout.KeyHold, Value: encodeJSON(o.q)})
		}
	}
	err = h.Source.Apply(ctx, source, Batch{Preconditions: pre, Writes: writes})
	if MayBeApplied(err) {
		// rs tells: only this batch writes the released rs.
		if cur, ok, rerr := h.Source.Get(ctx, source, KeyRS); rerr == nil && ok && bytes.Equal(cur, nextRaw) {
			err = nil
		}
	}
	return o, ferr, err
}

// loadTarget reads target's records; ErrUnknownTarget when it has none.
func (o *opRun) loadTarget(t Partition) (targetEnq, targetRec, bool, error) {
	return loadTarget(o.ctx, o.h.Source, o.source, t, folds{os: o.start.os, rs: o.start.rs.RelayState})
}

// loadTarget reads target's records, with the figures fs folds over them.
func loadTarget(ctx context.Context, st Store, source, t Partition, fs folds) (targetEnq, targetRec, bool, error) {
	prefix := layout.TargetPrefix + targetHex(t) + "/"
	items, err := scanItems(ctx, st, source, prefix, prefixEnd(prefix))
	if err != nil {
		return targetEnq{}, targetRec{}, false, fmt.Errorf("%s/%q: %w", source, t, err)
	}
	var e targetEnq
	r := targetRec{Target: t, State: StateActive}
	found := false
	for _, it := range items {
		switch it.Key {
		case targetEnqKey(t):
			if e, err = decodeTargetEnq(it.Value, true); err != nil {
				return e, r, false, err
			}
		case targetStateKey(t):
			if r, err = decodeTargetRec(t, it.Value, true); err != nil {
				return e, r, false, err
			}
			found = true
		}
	}
	fe, inOS := fs.os.enqOf(t)
	if len(items) == 0 && !inOS && !fs.rs.hasDone(t) {
		return e, r, false, fmt.Errorf("%s/%q: %w", source, t, ErrUnknownTarget)
	}
	if inOS {
		e = fe
	}
	fs.rs.overlayDone(&r)
	return e, r, found, nil
}

// putRec writes r (from before) with its marker and the q totals.
func (o *opRun) putRec(before, r targetRec) {
	have, want := "", ""
	if before.State == StateActive && before.Held > 0 {
		have = retryKey(before.RetryMS, r.Target)
	}
	if r.State == StateActive && r.Held > 0 {
		if r.RetryMS == 0 {
			r.RetryMS = o.now
		}
		want = retryKey(r.RetryMS, r.Target)
	} else {
		r.RetryMS = 0
	}
	if have != want {
		if have != "" {
			o.writes = append(o.writes, Write{Key: have, Delete: true})
		}
		if want != "" {
			o.writes = append(o.writes, Write{Key: want, Value: markerValue})
		}
	}
	o.writes = append(o.writes, Write{Key: targetStateKey(r.Target), Value: encodeTargetRec(r)})
	o.unfold = append(o.unfold, r.Target) // the record now holds its progress
	o.q.account(before, r)
}

// wake makes the source's durable alarm due now (guarded on the alarm as
// read), so held rows released for redrive go out without waiting for the
// sweeper, and kicks after the commit. An alarm already due is rewritten at
// its due time rather than only checked, so that an alarm clear of single
// writes under way (clearSingles), whose delete is guarded on the alarm's
// value, fails instead of leaving the released rows without a wake-up.
func (o *opRun) wake() error {
	raw, found, err := o.h.Source.Get(o.ctx, o.source, KeyAlarm)
	if err != nil {
		return fmt.Errorf("%s: read alarm: %w", o.source, err)
	}
	if found {
		o.pre = append(o.pre, Precondition{Key: KeyAlarm, Value: raw})
		if a, err := decodeAlarm(raw); err == nil && a.DueMS <= o.now {
			o.writes = append(o.writes, alarmRewrite(a.DueMS, newNonce()))
			o.kick = true
			return nil
		}
	} else {
		o.pre = append(o.pre, Precondition{Key: KeyAlarm, Absent: true})
	}
	o.writes = append(o.writes, alarmWrite(o.now))
	o.kick = true
	return nil
}

func (o *opRun) note(r *targetRec, action Action, a Actor) {
	r.Note = &OperatorNote{Action: string(action), By: a.By, Reason: a.Reason, AtMS: o.now}
}

// setTargetState is quarantine and pause: rows, existing and new, are held
// in order (what the outbox holds of them now at once, as far as the batch
// has room; the rest from the next fire on); nothing is tried until
// release/resume.
func (h *RelayHandler) setTargetState(ctx context.Context, source, target Partition, state TargetState, action Action, a Actor) (TargetStatus, error) {
	if err := a.Validate(action); err != nil {
		return TargetStatus{}, err
	}
	var out TargetStatus
	err := h.operate(ctx, source, func(o *opRun) error {
		e, r, _, err := o.loadTarget(target)
		if err != nil {
			return err
		}
		if err := action.check(target, r.State); err != nil {
			return err
		}
		before := r
		r.setState(state, o.now)
		r.FailedRounds, r.FailedAttempts = 0, 0
		if err := o.holdOutbox(e, &r); err != nil {
			return err
		}
		o.note(&r, action, a)
		o.putRec(before, r)
		out = statusOf(target, e, r)
		return nil
	})
	return out, err
}

// holdOutbox moves r's target's pages still in the outbox aside into its
// held pages, oldest first, in the action's batch, so that a quarantine or
// pause holds the rows at once (its status shows them held, and a skip
// right after it finds them) instead of from the next fire that meets
// them. The target's pages are found through e's runs (a run's seqs are
// all the target's, so any page keyed within one is its own), without
// scanning the outbox. It moves only a prefix of the target's outbox rows,
// so held rows stay older than anything the target still has in the
// outbox: nothing when e dropped older runs and the pages found do not
// account for all of its outbox rows (e.n − done − held), and no more than
// fits the batch and a fire's inspection budget; the fires move the rest,
// as before.
func (o *opRun) holdOutbox(e targetEnq, r *targetRec) error {
	st, caps := o.h.Source, o.h.Source.Capabilities()
	var pages []Page
	var raws [][]byte
	found := uint64(0)
	for _, run := range e.Runs {
		items, err := scanItems(o.ctx, st, o.source, layout.PageKey(uint64(run[0])), layout.PageKey(uint64(run[1])+1))
		if err != nil {
			return fmt.Errorf("%s/%q: read outbox pages: %w", o.source, r.Target, err)
		}
		for _, it := range items {
			p, err := decodePage(it.Key, it.Value)
			if err != nil {
				return err
			}
			if p.Target != r.Target || len(p.Rows) == 0 || (len(pages) > 0 && p.First <= pages[len(pages)-1].Last()) {
				return nil // not what the runs promise: leave it to the fires
			}
			pages = append(pages, p)
			raws = append(raws, it.Value)
			found += uint64(len(p.Rows))
		}
	}
	if e.Dropped && found+r.Done+r.Held != e.N {
		return nil // older pages may lie outside the runs e still lists
	}
	// The batch: rs, q, the target record and a marker's delete and put,
	// then two writes per page moved.
	items := len(o.writes) + 5
	size := caps.ItemSize(o.source, KeyRS, rsMaxBytes) + caps.ItemSize(o.source, layout.KeyHold, holdMaxBytes) +
		caps.ItemSize(o.source, targetStateKey(r.Target), targetRecMaxBytes) + 2*caps.ItemSize(o.source, retryKey(0, r.Target), 0)
	rowsLeft := o.h.budget().inspectPerFire()
	for i, p := range pages {
		n, b := 2, caps.ItemSize(o.source, heldKeyFor(p), len(raws[i]))+caps.ItemSize(o.source, p.Key, 0)
		if len(p.Rows) > rowsLeft || (caps.MaxBatchItems > 0 && items+n > caps.MaxBatchItems) || (caps.MaxBatchBytes > 0 && size+b > caps.MaxBatchBytes) {
			break
		}
		items, size, rowsLeft = items+n, size+b, rowsLeft-len(p.Rows)
		o.writes = append(o.writes, Write{Key: p.Key, Delete: true}, Write{Key: heldKeyFor(p), Value: raws[i]})
		addHeld(r, p)
	}
	return nil
}

// Quarantine stops delivery to target: its rows, existing and new, are
// held in order and no calls are spent on it until Release. Allowed from
// active and paused; quarantining a quarantined target is an error
// (TargetStateError), so a script notices it did nothing.
func (h *RelayHandler) Quarantine(ctx context.Context, source, target Partition, a Actor) (TargetStatus, error) {
	return h.setTargetState(ctx, source, target, StateQuarantined, ActionQuarantine, a)
}

// Pause stops delivery to target on purpose (maintenance): rows are held in
// order and failures are not counted until Resume. Allowed from active.
func (h *RelayHandler) Pause(ctx context.Context, source, target Partition, a Actor) (TargetStatus, error) {
	return h.setTargetState(ctx, source, target, StatePaused, ActionPause, a)
}

// Release ends a quarantine: held rows are redriven oldest first, before
// any newer row of the target, starting with the next fire (the source's
// alarm is made due now). If they fail again the target returns to
// quarantine at once.
func (h *RelayHandler) Release(ctx context.Context, source, target Partition, a Actor) (TargetStatus, error) {
	return h.reactivate(ctx, source, target, ActionRelease, a)
}

// Resume ends a pause: held rows are delivered oldest first, before any
// newer row, from the next fire on; failures count as usual.
func (h *RelayHandler) Resume(ctx context.Context, source, target Partition, a Actor) (TargetStatus, error) {
	return h.reactivate(ctx, source, target, ActionResume, a)
}

func (h *RelayHandler) reactivate(ctx context.Context, source, target Partition, action Action, a Actor) (TargetStatus, error) {
	if err := a.Validate(action); err != nil {
		return TargetStatus{}, err
	}
	var out TargetStatus
	err := h.operate(ctx, source, func(o *opRun) error {
		e, r, _, err := o.loadTarget(target)
		if err != nil {
			return err
		}
		if err := action.check(target, r.State); err != nil {
			return err
		}
		before := r
		r.setState(StateActive, o.now)
		r.FailedRounds, r.FailedAttempts = 0, 0
		if r.Held > 0 {
			r.RetryMS = o.now
			r.Released = action == ActionRelease
		}
		o.note(&r, action, a)
		o.putRec(before, r)
		if err := o.wake(); err != nil {
			return err
		}
		out = statusOf(target, e, r)
		return nil
	})
	return out, err
}

// SkipRequest names the rows to skip: the target's held rows from
// ExpectFirst (which must be its first undelivered held seq, so a skip raced
// by delivery fails cleanly) through Through.
type SkipRequest struct {
	Target      Partition
	ExpectFirst uint64
	Through     uint64
	Actor
}

// Validate checks req as the engine does before the skip reads anything:
// its Actor (Actor.Validate with ActionSkip: a reason is required) and
// 0 < ExpectFirst <= Through. The error wraps ErrInvalidOperatorInput.
func (req SkipRequest) Validate() error {
	if err := req.Actor.Validate(ActionSkip); err != nil {
		return err
	}
	if req.ExpectFirst == 0 || req.Through < req.ExpectFirst {
		return fmt.Errorf("%w: skip %d..%d: want 0 < expect_first <= through", ErrInvalidOperatorInput, req.ExpectFirst, req.Through)
	}
	return nil
}

// SkipResult reports a skip: the archive entry's id and the rows it holds.
type SkipResult struct {
	ArchiveID uint64       `json:"archive_id"`
	Rows      int          `json:"rows"`
	First     uint64       `json:"first"`
	Last      uint64       `json:"last"`
	Status    TargetStatus `json:"status"`
}

// Skip removes a quarantined or paused target's held rows ExpectFirst..
// Through from the outbox without applying them, copying them in the same
// atomic source batch to the dead-row archive with who, why and the last
// error. They are never applied afterwards: deliveries of the target's
// later rows move its rh past them. Held rows the target already has
// (rh covers them) are cleaned, not archived. One request skips at most
// what fits one source batch (ErrSkipTooLarge names how far it may go).
func (h *RelayHandler) Skip(ctx context.Context, source Partition, req SkipRequest) (SkipResult, error) {
	if err := h.needStores("Skip", true); err != nil { // it reads the target's rh
		return SkipResult{}, err
	}
	if err := req.Validate(); err != nil {
		return SkipResult{}, err
	}
	if err := h.skipPrecheck(ctx, source, req); err != nil {
		return SkipResult{}, err
	}
	var out SkipResult
	err := h.operate(ctx, source, func(o *opRun) error {
		e, r, _, err := o.loadTarget(req.Target)
		if err != nil {
			return err
		}
		if err := ActionSkip.check(req.Target, r.State); err != nil {
			return err
		}
		pages, rh, first, err := h.readHeld(ctx, source, req.Target)
		if err != nil {
			return err
		}
		if err := req.conflict(first); err != nil {
			return err
		}
		if req.Through > r.HeldLast {
			return fmt.Errorf("%w: through %d is past the last held seq %d", ErrSkipRange, req.Through, r.HeldLast)
		}
		caps := h.Source.Capabilities()
		before := r
		codec := codecFor(caps)
		items2, bytes2 := 4, caps.ItemSize(source, KeyRS, rsMaxBytes)+caps.ItemSize(source, layout.KeyHold, holdMaxBytes)+
			caps.ItemSize(source, targetStateKey(req.Target), targetRecMaxBytes)+2*caps.ItemSize(source, retryKey(0, req.Target), 0)+
			caps.ItemSize(source, deadKey(first), 2048+2*MaxReasonLen)
		var skipped, cleaned uint64
		var last uint64
		var writes []Write
		remainingFirst, remainingMS := uint64(0), int64(0)
		for _, p := range pages {
			if p.First > req.Through {
				if remainingFirst == 0 {
					remainingFirst, remainingMS = p.First, p.CommitMS
				}
				break
			}
			var skip, rest []Row
			var clean uint64
			for _, row := range p.Rows {
				switch {
				case row.Seq <= rh:
					clean++
				case row.Seq <= req.Through:
					skip = append(skip, row)
				default:
					rest = append(rest, row)
				}
			}
			var w []Write
			n := 1
			size := caps.ItemSize(source, p.Key, 0)
			if len(rest) > 0 {
				rp := p
				rp.Rows, rp.First = rest, rest[0].Seq
				v := codec.encode(rp)
				w = append(w, Write{Key: p.Key, Value: v})
				size = caps.ItemSize(source, p.Key, len(v))
				if remainingFirst == 0 {
					remainingFirst, remainingMS = rest[0].Seq, p.CommitMS
				}
			} else {
				w = append(w, Write{Key: p.Key, Delete: true})
			}
			if len(skip) > 0 {
				sp := p
				sp.Rows, sp.First = skip, skip[0].Seq
				v := codec.encode(sp)
				w = append(w, Write{Key: deadPageKey(first, skip[0].Seq), Value: v})
				n++
				size += caps.ItemSize(source, deadPageKey(first, skip[0].Seq), len(v))
			}
			if (caps.MaxBatchItems > 0 && items2+n > caps.MaxBatchItems) || (caps.MaxBatchBytes > 0 && bytes2+size > caps.MaxBatchBytes) {
				return fmt.Errorf("%w: skip through at most seq %d in one request", ErrSkipTooLarge, max(last, first))
			}
			items2, bytes2 = items2+n, bytes2+size
			writes = append(writes, w...)
			skipped += uint64(len(skip))
			cleaned += clean
			if len(skip) > 0 {
				last = skip[len(skip)-1].Seq
			}
		}
		r.Done += skipped + cleaned
		r.Held -= min(r.Held, skipped+cleaned)
		r.Skipped += skipped
		r.Through = max(r.Through, rh)
		if r.Held == 0 || remainingFirst == 0 {
			r.Held, r.HeldFirst, r.HeldLast, r.HeldMS = 0, 0, 0, 0
		} else {
			r.HeldFirst, r.HeldMS = remainingFirst, remainingMS
		}
		o.note(&r, ActionSkip, req.Actor)
		entry := deadEntry{V: 1, TargetHex: targetHex(req.Target), First: first, Last: last, Rows: int(skipped),
			By: req.By, Reason: req.Reason, AtMS: o.now, LastError: r.LastError}
		if utf8.ValidString(string(req.Target)) {
			entry.Target = string(req.Target)
		}
		o.writes = append(o.writes, Write{Key: deadKey(first), Value: encodeJSON(entry)})
		o.pre = append(o.pre, Precondition{Key: deadKey(first), Absent: true})
		o.writes = append(o.writes, writes...)
		o.putRec(before, r)
		out = SkipResult{ArchiveID: first, Rows: int(skipped), First: first, Last: last, Status: statusOf(req.Target, e, r)}
		return nil
	})
	return out, err
}

// skipPrecheck refuses, before the claim is taken (so without writing rs
// twice to answer), a skip the target's records already rule out: a target
// unknown or not quarantined or paused, nothing held, a range that starts
// or ends below the first held seq (HeldFirst is a lower bound of the
// first undelivered held row) or ends past the last. The claimed skip
// checks all of it again.
func (h *RelayHandler) skipPrecheck(ctx context.Context, source Partition, req SkipRequest) error {
	fs, err := readFolds(ctx, h.Source, source)
	if err != nil {
		return err
	}
	_, r, _, err := loadTarget(ctx, h.Source, source, req.Target, fs)
	if err != nil {
		return err
	}
	if err := ActionSkip.check(req.Target, r.State); err != nil {
		return err
	}
	if r.Held > 0 && req.Through > r.HeldLast {
		return fmt.Errorf("%w: through %d is past the last held seq %d", ErrSkipRange, req.Through, r.HeldLast)
	}
	if r.Held > 0 && req.ExpectFirst >= r.HeldFirst {
		return nil // possible: the claimed skip decides
	}
	// Ruled out by the record; the held rows say what the first one is
	// (reads only). A fire that moved rows aside since may make it fit.
	_, _, first, err := h.readHeld(ctx, source, req.Target)
	if err != nil {
		return err
	}
	return req.conflict(first)
}

// readHeld reads target's held pages (in seq order), its rh at the target
// store and the first held seq above rh (0: none).
func (h *RelayHandler) readHeld(ctx context.Context, source, target Partition) (pages []Page, rh, first uint64, err error) {
	if rh, err = TargetWatermark(ctx, h.Target, target, source); err != nil {
		return nil, 0, 0, err
	}
	prefix := heldPrefix(target)
	items, err := scanItems(ctx, h.Source, source, prefix, prefixEnd(prefix))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s/%q: read held rows: %w", source, target, err)
	}
	for _, it := range items {
		p, err := decodePage(it.Key, it.Value)
		if err != nil {
			return nil, 0, 0, err
		}
		pages = append(pages, p)
		for _, row := range p.Rows {
			if row.Seq > rh && first == 0 {
				first = row.Seq
			}
		}
	}
	return pages, rh, first, nil
}

// conflict is the skip's answer when first is the first undelivered held
// seq: nil when it is the expected one.
func (req SkipRequest) conflict(first uint64) error {
	if first == 0 {
		return &SkipConflictError{Target: req.Target, Expected: req.ExpectFirst, Reason: "no held rows (the target's rows are held by the next fire that meets them)"}
	}
	if first != req.ExpectFirst {
		return &SkipConflictError{Target: req.Target, Expected: req.ExpectFirst, Actual: first, Reason: "the first undelivered held row is another"}
	}
	return nil
}
