package relaycore

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

type claimedRS struct {
	RelayState
	newCycle bool
}

// claimed is what a fire (or an operator action) starts from: rs as
// claimed and exactly as written, os and the hold summary q.
type claimed struct {
	rs    claimedRS
	rsRaw []byte
	os    OutboxState
	q     holdSummary
	// unknown: neither rs nor os exists (nothing was ever enqueued or
	// fired for the source), so a fire has nothing to do and claims
	// nothing: a fire event naming a source nobody wrote to leaves no item.
	unknown bool
}

// readOSHold reads os and q with one scan: they are adjacent keys.
// osFound: os exists (every enqueue and DeclareLeaseRequired writes it).
func readOSHold(ctx context.Context, st Store, source Partition) (os OutboxState, q holdSummary, osFound bool, err error) {
	head, err := scanRange(ctx, st, source, KeyOS, layout.KeyHold+"\x00")
	if err != nil {
		return OutboxState{}, holdSummary{}, false, fmt.Errorf("read os %s: %w", source, err)
	}
	osRaw, osFound := head[KeyOS]
	os, err = decodeOS(osRaw, osFound)
	if err != nil {
		return OutboxState{}, holdSummary{}, false, err
	}
	qRaw, qFound := head[layout.KeyHold]
	q, err = decodeHold(qRaw, qFound)
	return os, q, osFound, err
}

// claimReads are what a claim reads beside rs, os and q, and when.
type claimReads struct {
	// side, when set, is a read of the caller's own (a fire's due retry
	// markers) made with the read of os and q, at the same time: a
	// request's latency in front of the fire instead of two. It may run
	// more than once (never twice at once) and keeps only its last
	// result.
	side func() error
	// early: the caller expects rs to show its own claim, kept from its
	// previous fire (an alarm's fires after the first), so os, q and side
	// are read at the same time as rs, not after it. Nobody else writes q
	// or the markers while rs shows the caller's claim (every such write
	// is made under a claim and guarded on rs), so what they read is
	// current; when rs shows anything else, they are read again after rs,
	// as for a claim that is not kept.
	early bool
}

// headRead is the read of os and q (and the claim's side read) in front of
// a claim.
type headRead struct {
	os      OutboxState
	q       holdSummary
	osFound bool
	err     error
}

// readRS reads rs and, when early, the head (into *head) at the same time.
// A handler that makes one store call at a time (overlapReads) reads the
// head first: of the orders the calls can take at once, the one where a
// write may fall between them, which the deterministic simulation then
// explores.
func (h *RelayHandler) readRS(ctx context.Context, source Partition, side func() error, early bool, head *headRead) ([]byte, bool, error) {
	if !early {
		return h.Source.Get(ctx, source, KeyRS)
	}
	if !h.overlapReads() {
		*head = h.readHead(ctx, source, side)
		return h.Source.Get(ctx, source, KeyRS)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		*head = h.readHead(ctx, source, side)
	}()
	raw, found, err := h.Source.Get(ctx, source, KeyRS)
	<-done // always awaited: side must not run twice at once
	return raw, found, err
}

// readHead reads os and q and side: at the same time, unless the handler
// makes one store call at a time (then side goes second).
func (h *RelayHandler) readHead(ctx context.Context, source Partition, side func() error) headRead {
	var sideErr error
	var wg sync.WaitGroup
	overlap := side != nil && h.overlapReads()
	if overlap {
		wg.Go(func() { sideErr = side() })
	}
	var hr headRead
	hr.os, hr.q, hr.osFound, hr.err = readOSHold(ctx, h.Source, source)
	wg.Wait()
	if side != nil && !overlap && hr.err == nil {
		sideErr = side()
	}
	if hr.err == nil {
		hr.err = sideErr
	}
	return hr
}

// overlapReads reports whether a fire may have several store calls in
// flight: with DeliverConcurrency above 1. At 0 or 1 every call of a fire
// is made one after another, the original design's fire, and what the
// deterministic simulation needs (it runs one store call at a time).
func (h *RelayHandler) overlapReads() bool { return h.DeliverConcurrency > 1 }

// claim reads rs, os and q and takes the source's fire claim, starting a
// new cycle when rs is absent or completed (unless keepCycle: an operator
// action claims without touching the cycle). busy reports another live
// claim; the claimed value's rs then holds the claim met (nil when the
// claim was lost to races). Before it returns, no ghost of rs.gone is
// left (gone.go): it deletes them, unless memo says the caller's alarm
// did, and a claim it writes clears the list.
func (h *RelayHandler) claim(ctx context.Context, source Partition, token string, now int64, keepCycle bool, memo *goneMemo, reads claimReads) (claimed, bool, error) {
	// unknown is the latest claim write whose outcome was unknown and
	// which had not landed: attempts that all end so are a store that
	// does not commit (a full disk), an error, not a busy source (which
	// the host would count and log as nothing wrong).
	var unknown error
	for attempt := 0; attempt < 4; attempt++ {
		early := reads.early && attempt == 0
		var head headRead
		raw, found, err := h.readRS(ctx, source, reads.side, early, &head)
		if err != nil {
			return claimed{}, false, fmt.Errorf("claim %s: read rs: %w", source, err)
		}
		var rs RelayState
		if found {
			if rs, err = decodeRS(raw); err != nil {
				return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
			}
		}
		if c := rs.Claim; c != nil && c.Owner != token && c.UntilMS > now {
			return claimed{rs: claimedRS{RelayState: rs}}, true, nil
		}
		if !early || rs.Claim == nil || rs.Claim.Owner != token {
			// Read after rs: a claim written on this rs lands only if
			// nothing guarded on rs (q, the markers) changed since.
			head = h.readHead(ctx, source, reads.side)
		}
		os, q, osFound := head.os, head.q, head.osFound
		if err := head.err; err != nil {
			return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
		}
		if !found && !osFound && !keepCycle {
			// An enqueue committing after these reads arms the alarm and
			// kicks another fire, which finds os.
			return claimed{unknown: true}, false, nil
		}
		if keys := ghostKeys(rs); !memo.done(keys) {
			if err := h.deleteGhosts(ctx, source, keys); err != nil {
				return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
			}
		}
		newCycle := !keepCycle && (!found || rs.Completed())
		if !newCycle && rs.Claim != nil && rs.Claim.Owner == token {
			return claimed{rs: claimedRS{RelayState: rs}, rsRaw: raw, os: os, q: q}, false, nil // kept from our previous fire
		}
		next := rs
		next.Version++
		next.Gone, next.GoneHeld = nil, nil
		if newCycle {
			next.CycleEnd, next.Cursor, next.From, next.Blocked = os.NextSeq-1, 0, "", nil
		}
		next.Claim = &Claim{Owner: token, UntilMS: now + h.claimTTL().Milliseconds()}
		nextRaw := encodeJSON(next)
		pre := Precondition{Key: KeyRS, Absent: true}
		if found {
			pre = Precondition{Key: KeyRS, Value: raw}
		}
		err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{pre}, Writes: []Write{{Key: KeyRS, Value: nextRaw}}})
		if err == nil {
			return claimed{rs: claimedRS{RelayState: next, newCycle: newCycle}, rsRaw: nextRaw, os: os, q: q}, false, nil
		}
		if _, ok := FailedPrecondition(err); ok {
			unknown = nil // lost a race
			continue
		}
		if MayBeApplied(err) {
			if cur, ok, rerr := h.Source.Get(ctx, source, KeyRS); rerr == nil && ok && bytes.Equal(cur, nextRaw) {
				return claimed{rs: claimedRS{RelayState: next, newCycle: newCycle}, rsRaw: nextRaw, os: os, q: q}, false, nil
			}
			unknown = err
			continue
		}
		return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
	}
	if unknown != nil {
		return claimed{}, false, fmt.Errorf("claim %s: the claim did not land in 4 attempts: %w", source, unknown)
	}
	return claimed{}, true, nil
}

// opTokenPrefix starts an operator action's claim token.
const opTokenPrefix = "op-"

// opBusyRetry is how soon an alarm that met an operator action's claim is
// tried again: an action holds the claim for a few store calls, its
// ClaimTTL only bounds one that crashed.
const opBusyRetry = time.Second

// busyRetryMS is when an alarm that met claim c at now should try again:
// when c lapses (a crashed holder's claim lapses then, and a live holder's
// alarm has re-armed by then), or after opBusyRetry for an operator's. 0:
// no claim was met (the claim was lost to races with live fires, which
// re-arm the alarm themselves).
func busyRetryMS(c *Claim, now int64) int64 {
	if c == nil {
		return 0
	}
	if strings.HasPrefix(c.Owner, opTokenPrefix) {
		return min(c.UntilMS, now+opBusyRetry.Milliseconds())
	}
	return c.UntilMS
}

// releaseTimeout bounds releaseClaim, which runs even when the failed
// call's context was cancelled.
const releaseTimeout = time.Second

// releaseClaim gives up token's claim on source, if rs still holds it: the
// way out of a fire or an operator action that failed, so that the source
// is not refused as busy for ClaimTTL with nothing running. It is guarded
// on rs as read, so it never releases another holder's claim, and it keeps
// everything else in rs (a cycle the claim started goes on). Best effort:
// when it fails too (the store is down, the process dies) the claim lapses
// after ClaimTTL as before. It runs without the caller's cancellation (a
// cancelled fire releases too), within releaseTimeout.
func (h *RelayHandler) releaseClaim(ctx context.Context, source Partition, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	raw, found, err := h.Source.Get(ctx, source, KeyRS)
	if err == nil && found {
		var rs RelayState
		if rs, err = decodeRS(raw); err == nil {
			if rs.Claim == nil || rs.Claim.Owner != token {
				return // released by the failed call after all, or taken over
			}
			rs.Version++
			rs.Claim = nil
			err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{{Key: KeyRS, Value: raw}}, Writes: []Write{{Key: KeyRS, Value: encodeJSON(rs)}}})
		}
	}
	if _, lost := FailedPrecondition(err); err != nil && !lost {
		loggerOr(h.Logger).Warn("relay claim release failed; the claim lapses after its ttl", "source", string(source), "err", err)
	}
}

// claim is a fire's first step: take the source's claim under f.token and
// set the attempt up from rs, os and q as claimed. busy: another live fire
// holds the claim (res.Busy says so, with when to try again).
func (f *fireRun) claim() (busy bool, err error) {
	h, res := f.h, f.res
	now := unixMS(h.clock().Now())
	// The budget and the time first: the side read (due markers) needs
	// them.
	f.b, f.now = h.budget(), now
	side := func() error {
		var err error
		f.nextDue, f.dueLeft = 0, false
		f.markers, err = f.dueMarkers()
		return err
	}
	start, busy, err := h.claim(f.ctx, f.source, f.token, now, false, f.memo, claimReads{side: side, early: f.early})
	if f.unknown = start.unknown; f.unknown {
		return false, nil
	}
	if err != nil || busy {
		res.Busy = busy
		if busy {
			res.BusyRetryMS = busyRetryMS(start.rs.Claim, now)
		}
		return busy, err
	}
	res.NewCycle = start.rs.newCycle
	f.caps, f.start, f.cur, f.recs = h.Source.Capabilities(), start, start.rs.RelayState, map[Partition]*recSlot{}
	f.loose, f.goneRoom = h.looseDeleter() != nil, goneBytes(f.caps)-goneOverhead
	f.itemsRoom, f.bytesRoom = 1<<30, 1<<30
	if f.caps.MaxBatchItems > 0 {
		f.itemsRoom = f.caps.MaxBatchItems - 2 // rs and q
	}
	if f.caps.MaxBatchBytes > 0 {
		f.bytesRoom = f.caps.MaxBatchBytes - f.caps.ItemSize(f.source, KeyRS, rsBound(f.caps)) - f.caps.ItemSize(f.source, layout.KeyHold, holdMaxBytes)
	}
	f.cur.Claim = start.rs.Claim
	return false, nil
}

// AlarmCheck is a source's wake-up as a sweeper sees it just before firing
// one it did not arm itself (an alarm found through the due index, or a
// retry after meeting a claim): whether there is anything to fire, and
// whether a fire or an operator action is at work on it already. Several
// processes sweeping one store use it to leave a source to the process
// that holds it, for the price of one read instead of a fire.
type AlarmCheck struct {
	// DueMS is the alarm record's due time (unix ms), 0 when the source has
	// no alarm record: its outbox was empty when the last alarm cleared it,
	// so there is nothing to fire.
	DueMS int64
	// Claim is the live claim met (UntilMS after now), nil when none.
	Claim *Claim
	// RetryMS, when Claim is set, is when the source is worth trying again,
	// as FireResult.BusyRetryMS: when the claim lapses, or within a second
	// for an operator action's.
	RetryMS int64
	// Operator says the claim is an operator action's, which re-arms
	// nothing when it ends (a fire's holder re-arms the alarm itself).
	Operator bool
	// Blocked is the size of the source's blocked set (rs), as
	// AlarmResult.Blocked reports it after an alarm.
	Blocked int
}

// Fire reports whether a fire at nowMS would find work nobody else is
// doing: the alarm is armed, due, and no live claim holds the source.
func (c AlarmCheck) Fire(nowMS int64) bool {
	return c.DueMS != 0 && c.DueMS <= nowMS && c.Claim == nil
}

// CheckAlarm reads source's alarm record and rs in one GetMany and says
// whether its alarm is due and whether a live claim holds it (see
// AlarmCheck). It changes nothing; what it reads may change right after,
// so it only saves work: a fire it lets through may still meet a claim
// taken meanwhile (and returns Busy, as always).
func CheckAlarm(ctx context.Context, st Store, source Partition, now time.Time) (AlarmCheck, error) {
	vals, err := GetMany(ctx, st, source, []string{KeyAlarm, KeyRS})
	if err != nil {
		return AlarmCheck{}, fmt.Errorf("check alarm %s: %w", source, err)
	}
	var chk AlarmCheck
	if raw, ok := vals[KeyAlarm]; ok {
		a, err := decodeAlarm(raw)
		if err != nil {
			return AlarmCheck{}, fmt.Errorf("check alarm %s: %w", source, err)
		}
		chk.DueMS = max(a.DueMS, 1)
	}
	if raw, ok := vals[KeyRS]; ok {
		rs, err := decodeRS(raw)
		if err != nil {
			return AlarmCheck{}, fmt.Errorf("check alarm %s: %w", source, err)
		}
		chk.Blocked = len(rs.Blocked)
		nowMS := unixMS(now)
		if c := rs.Claim; c != nil && c.UntilMS > nowMS {
			chk.Claim, chk.RetryMS, chk.Operator = c, busyRetryMS(c, nowMS), strings.HasPrefix(c.Owner, opTokenPrefix)
		}
	}
	return chk, nil
}
