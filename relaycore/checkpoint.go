package relaycore

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// rsMaxBytes bounds an encoded rs: a full blocked set of longest names, each
// at its worst encoding (blockedNameMaxJSON), plus the scalar fields.
// The folded progress entries come on top (rsBound).
// The sweep cursor is a t/ key of the longest name.
const rsMaxBytes = 512 + (MaxBlockedTargets+1)*blockedNameMaxJSON + len(`,"sweep_after":"t//~"`) + 2*MaxPartitionLen

// rsBound is rs's largest encoding on a store with caps: rsMaxBytes and
// the room for folded entries and for a full rs.gone (kept on every store,
// so that pages planned on one fit a checkpoint of any kind).
func rsBound(caps Capabilities) int { return rsMaxBytes + foldBytes(caps) + goneBytes(caps) }

// targetRecMaxBytes bounds an encoded target record: bounded strings
// (error message, reason, actor) written by encodeJSON, at most two bytes
// per input byte once sanitized, plus the numeric fields.
const targetRecMaxBytes = 640 + 2*(maxErrorMessage+8) + 2*(MaxReasonLen+8) + 2*(MaxActorLen+8)

// holdMaxBytes bounds the encoded q record.
const holdMaxBytes = 400

// CheckpointReserve is the room (as the store's item sizes) a fire
// checkpoint keeps for rs, q, one target record and two retry markers, and
// for moving a page aside (the delete of its outbox key and the longer held
// key), besides the page itself: a page that fits beside it can always be
// collected, rewritten or moved aside by a fire that meets it first, so
// enqueue plans pages within MaxBatchBytes − CheckpointReserve.
//
// Enqueue asks for it for every row it checks and every page it plans, so
// the sizes that depend only on caps are computed once per Capabilities
// (reserveBase): building the longest target's keys each time cost about
// 8.5 µs and 14 allocations a call, an eighth of relay serve's CPU.
func CheckpointReserve(source Partition, caps Capabilities) int {
	return reserveBase(caps) + reserveItems*caps.ItemSize(source, "", 0)
}

// reserveItems is how many items CheckpointReserve counts, each of which
// pays the source partition's size once.
const reserveItems = 7

// reserveBases memoizes reserveBase by Capabilities (comparable; a process
// sees a handful).
var reserveBases sync.Map

// reserveBase is CheckpointReserve less the source partition's share: the
// sizes of its items in an empty partition name, less ItemSize's overhead
// counted once per item by the partition term.
func reserveBase(caps Capabilities) int {
	if v, ok := reserveBases.Load(caps); ok {
		return v.(int)
	}
	long := Partition(strings.Repeat("x", MaxPartitionLen))
	sum := caps.ItemSize("", KeyRS, rsBound(caps)) + caps.ItemSize("", layout.KeyHold, holdMaxBytes) +
		caps.ItemSize("", targetStateKey(long), targetRecMaxBytes) + 2*caps.ItemSize("", retryKey(0, long), 0) +
		caps.ItemSize("", heldPageKey(long, 0), 0) + caps.ItemSize("", layout.PageKey(0), 0)
	base := sum - reserveItems*caps.ItemSize("", "", 0)
	reserveBases.Store(caps, base)
	return base
}

// autoActor is the note's actor when the engine quarantines a target.
const autoActor = "relay (automatic)"

// markerValue is what a retry marker holds: the key says everything.
var markerValue = []byte("1")

// checkpoint writes, in one batch guarded on rs (which holds the claim):
// the new rs, the hold summary, every target record the fire changed, the
// retry markers, and the page changes — delivered pages deleted, partly
// delivered ones rewritten, and pages of targets that hold moved aside.
// Its parts run in the order they add to the batch.
func (f *fireRun) checkpoint() (FireResult, bool, error) {
	c := &checkpointBatch{f: f, next: f.cur, newBlocked: append(slices.Clone(f.cur.Blocked), f.backoff...), codec: codecFor(f.caps), quarantineAfter: f.h.quarantineAfter()}
	c.next.Version++
	c.next.Cursor, c.next.From = f.stop, f.stopFrom
	// The claim deleted the ghosts rs listed (or this alarm's last fire
	// did): the list is this checkpoint's own.
	c.next.Gone, c.next.GoneHeld = nil, nil
	if f.turnTaken {
		c.next.HeldFirst = f.heldFirst
	}
	c.heldRows()
	c.selected()
	c.heldPages()
	c.records()
	c.nextRS()
	return c.apply()
}

// checkpointBatch is a checkpoint as its parts build it.
type checkpointBatch struct {
	f               *fireRun
	next            RelayState  // rs as the checkpoint writes it
	nextRaw         []byte      // next, encoded (nextRS)
	newBlocked      []Partition // the blocked set, before it is sorted into next
	writes          []Write     // the batch's writes, but rs's (nextRS puts it first)
	codec           pageCodec
	quarantineAfter int
	// quarantined: the targets this checkpoint quarantines for failing,
	// logged once it lands (recorded).
	quarantined []autoQuarantine
	// records' outcome: the hold summary as written, the earliest retry
	// marker left (0: none) and whether one is due already.
	q         holdSummary
	nextRetry int64
	more      bool
}

// clean deletes tw's delivered rows from its pages (rewriting a partly
// delivered page under its key); moveAside, when set, moves the remaining
// rows aside under the held prefix instead.
func (c *checkpointBatch) clean(tw *targetWork, slot *recSlot, moveAside bool) {
	res := c.f.res
	for _, pg := range tw.pages {
		i, _ := slices.BinarySearchFunc(pg.Rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
		res.RowsCleaned += i
		slot.rec.Done += uint64(i)
		if tw.held {
			slot.rec.Held -= min(slot.rec.Held, uint64(i))
		}
		switch {
		case i == len(pg.Rows) && tw.looseHeld[pg.Key]:
			c.next.GoneHeld = append(c.next.GoneHeld, strings.TrimPrefix(pg.Key, layout.HeldPrefix))
		case i == len(pg.Rows):
			c.takeOut(pg.Key, tw.loose)
		case moveAside:
			rest := *pg
			rest.Rows = pg.Rows[i:]
			rest.First = rest.Rows[0].Seq
			c.takeOut(pg.Key, tw.loose)
			c.writes = append(c.writes, Write{Key: heldKeyFor(*pg), Value: c.codec.encode(rest)})
			addHeld(&slot.rec, rest)
			res.RowsHeld += len(rest.Rows)
		case i > 0:
			rest := *pg
			rest.Rows = pg.Rows[i:]
			rest.First = rest.Rows[0].Seq
			// Never longer than the page's rows with full keys, which the
			// planner kept within the item limit.
			c.writes = append(c.writes, Write{Key: pg.Key, Value: c.codec.encode(rest)})
		}
	}
	slot.rec.Through = max(slot.rec.Through, tw.dt)
}

// takeOut takes outbox page key out of the outbox: listed in rs.gone when
// loose (gone.go), else deleted in the batch.
func (c *checkpointBatch) takeOut(key string, loose bool) {
	if loose {
		if seq, err := pageSeq(key); err == nil {
			c.next.Gone = append(c.next.Gone, seq)
			return
		}
		// Scanned under the page prefix, so never: delete it in the batch
		// rather than lose track of it.
	}
	c.writes = append(c.writes, Write{Key: key, Delete: true})
}

// heldRows records the held rows that were due.
func (c *checkpointBatch) heldRows() {
	f, h, res := c.f, c.f.h, c.f.res
	for _, tw := range f.redrive {
		slot := f.recs[tw.target]
		c.clean(tw, slot, false)
		r := &slot.rec
		// Held counts exactly (moves add pages' rows, cleaning removes
		// them); the first held row is known when the fire saw it, else the
		// old one stays as a lower bound.
		if first, ms, ok := tw.remainingHeld(); ok {
			r.HeldFirst, r.HeldMS = first, ms
		}
		if r.Held == 0 {
			r.HeldFirst, r.HeldLast, r.HeldMS = 0, 0, 0
		}
		if tw.failed {
			r.failed(tw, f.now)
			if r.Released || r.FailedRounds >= c.quarantineAfter {
				why := fmt.Sprintf("%d failed rounds in a row", r.FailedRounds)
				if r.Released {
					why = "its held rows failed again after a release"
				}
				r.setState(StateQuarantined, f.now)
				r.Note = &OperatorNote{Action: "quarantine", By: autoActor, Reason: why, AtMS: f.now}
				res.TargetsQuarantined++
				c.quarantined = append(c.quarantined, autoQuarantine{tw.target, why, r.LastError})
				continue
			}
			r.RetryMS = f.now + h.retryDelay(r.FailedRounds).Milliseconds()
			continue
		}
		r.succeeded()
		r.RetryMS = f.now // more held rows are due at once; cleared below when none are left
	}
}

// selected records the targets selected by the outbox scan.
func (c *checkpointBatch) selected() {
	f, h, res := c.f, c.f.h, c.f.res
	for _, tw := range f.sel {
		slot := f.recs[tw.target]
		r := &slot.rec
		if tw.failed {
			r.failed(tw, f.now)
			switch {
			case (r.FailedRounds >= c.quarantineAfter || len(c.newBlocked) >= MaxBlockedTargets) && !f.roomToHold(tw, slot):
				// No room left in this checkpoint to move its rows aside:
				// the cursor pauses before them instead. The next fire meets
				// the target first, with room kept for that (it has failed).
				c.clean(tw, slot, false)
				if row, pg, ok := tw.firstUndelivered(); ok && row.Seq-1 < c.next.Cursor {
					c.next.Cursor, c.next.From = row.Seq-1, pg.Key
				}
			case r.FailedRounds >= c.quarantineAfter:
				c.clean(tw, slot, true)
				r.setState(StateQuarantined, f.now)
				r.Note = &OperatorNote{Action: "quarantine", By: autoActor, Reason: fmt.Sprintf("%d failed rounds in a row", r.FailedRounds), AtMS: f.now}
				res.TargetsQuarantined++
				c.quarantined = append(c.quarantined, autoQuarantine{tw.target, r.Note.Reason, r.LastError})
			case len(c.newBlocked) < MaxBlockedTargets:
				// Blocked for the rest of the cycle; later cycles skip it
				// until its back-off has passed (fireRun.backingOff).
				c.clean(tw, slot, false)
				c.newBlocked = append(c.newBlocked, tw.target)
				res.TargetsBlocked++
			default:
				// The blocked set is full: rather than end the cycle (which
				// would retry the same targets from the head for ever), the
				// target's rows are moved aside and retried on its own
				// schedule, while the scan goes on past them.
				c.clean(tw, slot, true)
				r.RetryMS = f.now + h.retryDelay(r.FailedRounds).Milliseconds()
				res.TargetsHeld++
			}
			continue
		}
		r.succeeded()
		c.clean(tw, slot, false)
		r.Next, r.NextMS = 0, 0
		if row, pg, ok := tw.firstUndelivered(); ok {
			r.Next, r.NextMS = row.Seq, row.CommitMS
			if row.Seq-1 < c.next.Cursor {
				c.next.Cursor, c.next.From = row.Seq-1, pg.Key
			}
		} else {
			res.TargetsDelivered++
		}
	}
}

// heldPages moves the pages of targets that hold aside.
func (c *checkpointBatch) heldPages() {
	f, res := c.f, c.f.res
	for _, m := range f.moves {
		slot := f.recs[m.page.Target]
		c.takeOut(m.page.Key, m.loose)
		c.writes = append(c.writes, Write{Key: heldKeyFor(m.page), Value: m.raw})
		addHeld(&slot.rec, m.page)
		res.RowsHeld += len(m.page.Rows)
	}
}

// records writes the target records, retry markers and the hold summary.
func (c *checkpointBatch) records() {
	f := c.f
	c.q = f.start.q
	qBefore := c.q
	c.nextRetry = f.nextDue
	c.more = f.dueLeft
	for _, t := range slices.Sorted(maps.Keys(f.recs)) {
		slot := f.recs[t]
		r := &slot.rec
		if !slot.reserved {
			continue // read, but the scan stopped before it: unchanged
		}
		if r.State == StateActive && r.Held > 0 {
			if r.RetryMS == 0 {
				r.RetryMS = f.now
			}
		} else {
			r.RetryMS = 0
			if r.Held == 0 {
				r.Released = false
			}
		}
		have := slot.marker
		if have == "" && slot.before.State == StateActive && slot.before.Held > 0 {
			have = retryKey(slot.before.RetryMS, t)
		}
		want := ""
		if r.RetryMS > 0 {
			want = retryKey(r.RetryMS, t)
			if c.nextRetry == 0 || r.RetryMS < c.nextRetry {
				c.nextRetry = r.RetryMS
			}
			c.more = c.more || r.RetryMS <= f.now
		}
		if have != want {
			if have != "" {
				c.writes = append(c.writes, Write{Key: have, Delete: true})
			}
			if want != "" {
				c.writes = append(c.writes, Write{Key: want, Value: markerValue})
			}
		}
		if raw := encodeTargetRec(*r); !bytes.Equal(raw, encodeTargetRec(slot.before)) {
			c.putRec(slot, raw)
		}
	}
	if c.q != qBefore {
		c.q.Version++
		c.writes = append(c.writes, Write{Key: layout.KeyHold, Value: encodeJSON(c.q)})
	}
}

// putRec records slot's changed record: in rs when only its delivery
// progress changed and rs has room for it (fold.go), else as the whole
// t/<hex>/s record, which then holds the progress too.
func (c *checkpointBatch) putRec(slot *recSlot, raw []byte) {
	r := slot.rec
	if onlyProgress(slot.before, r) {
		if entries, ok := foldDone(c.next.Targets, r, c.f.caps); ok {
			c.next.Targets = entries
			return
		}
	}
	c.next.Targets = unfoldDone(c.next.Targets, r.Target)
	c.writes = append(c.writes, Write{Key: targetStateKey(r.Target), Value: raw})
	c.q.account(slot.before, r)
}

// nextRS finishes the new rs (blocked set, cursor, idle count, the claim
// kept or not) and the fire's result, and puts rs first in the batch.
func (c *checkpointBatch) nextRS() {
	f, h, res, cur := c.f, c.f.h, c.f.res, c.f.cur
	slices.Sort(c.newBlocked)
	c.next.Blocked = slices.Compact(c.newBlocked)
	if c.next.Cursor >= c.next.CycleEnd {
		c.next.From = ""
	}

	// spent.delivered includes this fire's earlier attempts.
	moved := res.RowsCleaned > 0 || res.RowsHeld > 0
	res.Progress = f.spent.delivered > 0 || moved ||
		(!res.NewCycle && c.next.Cursor > cur.Cursor && res.TargetsBlocked == 0)
	if f.spent.delivered > 0 || moved {
		c.next.Idle = 0
	} else if !res.Progress {
		c.next.Idle++
	}
	completed := c.next.Cursor >= c.next.CycleEnd
	res.More = !(completed && len(c.next.Blocked) == 0 && f.start.os.NextSeq-1 == c.next.CycleEnd) || c.more
	if res.Progress {
		res.NextDueMS = f.now
	} else {
		res.NextDueMS = f.now + h.backoff(c.next.Idle).Milliseconds()
	}
	res.NextRetryMS = c.nextRetry
	res.sawNextSeq = f.start.os.NextSeq
	res.Hold = HoldSummary(c.q)
	c.next.Claim = nil
	if f.keep && res.continues() {
		c.next.Claim = &Claim{Owner: f.token, UntilMS: unixMS(h.clock().Now()) + h.claimTTL().Milliseconds()}
	}
	res.Blocked, res.Cursor, res.CycleEnd = len(c.next.Blocked), c.next.Cursor, c.next.CycleEnd
	slices.Sort(c.next.Gone)
	slices.Sort(c.next.GoneHeld)
	f.gone = ghostKeys(c.next)
	if c.next.SweptMS == 0 {
		// A source's idle sweeps count from its first checkpoint (rs is
		// written anyway), not from the epoch.
		c.next.SweptMS = f.now
	}
	res.sweptMS, res.sweepKnown = c.next.SweptMS, true
	c.nextRaw = encodeJSON(c.next)
	c.writes = append([]Write{{Key: KeyRS, Value: c.nextRaw}}, c.writes...)
}

// apply sends the batch guarded on rs as claimed, and settles a conflict or
// an unknown outcome by reading rs: landed, taken over by another fire
// (busy), or a conflict that makes the fire start over (retry).
func (c *checkpointBatch) apply() (FireResult, bool, error) {
	f, h, res := c.f, c.f.h, c.f.res
	pre := []Precondition{{Key: KeyRS, Value: f.start.rsRaw}}
	err := h.Source.Apply(f.ctx, f.source, Batch{Preconditions: pre, Writes: c.writes})
	if err == nil {
		return c.recorded(), false, nil
	}
	_, cond := FailedPrecondition(err)
	if !cond && !MayBeApplied(err) {
		res.unrecorded()
		return *res, false, fmt.Errorf("fire %s: checkpoint: %w", f.source, err)
	}
	// Conflict or unknown outcome: look at rs.
	raw, found, rerr := h.Source.Get(f.ctx, f.source, KeyRS)
	if rerr != nil {
		res.unrecorded()
		return *res, false, fmt.Errorf("fire %s: checkpoint: %v; re-read rs: %w", f.source, err, rerr)
	}
	if found && bytes.Equal(raw, c.nextRaw) {
		return c.recorded(), false, nil // it landed
	}
	if found {
		if other, derr := decodeRS(raw); derr == nil && other.Claim != nil && other.Claim.Owner != f.token && other.Claim.UntilMS > unixMS(h.clock().Now()) {
			res.Busy = true // another fire took over; our deliveries are idempotent
			res.BusyRetryMS = busyRetryMS(other.Claim, unixMS(h.clock().Now()))
			res.unrecorded()
			return *res, false, nil
		}
	}
	loggerOr(h.Logger).Info("relay checkpoint conflict; starting the fire over", "source", string(f.source), "err", err)
	res.unrecorded()
	res.TargetsAttempted, res.TargetsRedriven = 0, 0 // the next attempt counts them again
	return *res, true, nil
}

// autoQuarantine is a target a checkpoint quarantines for failing.
type autoQuarantine struct {
	target Partition
	why    string
	last   *LastError
}

// recorded is f.recorded for the checkpoint c, which landed: it also logs,
// at warn, each target it quarantined, so the log says when delivery to a
// target stopped and why (its failed attempts were logged one by one, and
// then nothing).
func (c *checkpointBatch) recorded() FireResult {
	for _, q := range c.quarantined {
		attrs := []any{"source", string(c.f.source), "target", string(q.target), "why", q.why}
		if q.last != nil {
			attrs = append(attrs, "last_error", q.last.Message)
		}
		loggerOr(c.f.h.Logger).Warn("relay target quarantined: release it once the cause is fixed (docs/operations.md)", attrs...)
	}
	return c.f.recorded()
}

// recorded is the result of a fire whose checkpoint landed. The rows it
// reports delivered are the rows it took out of the outbox and held pages
// because their target's rh covers them: each delivered row leaves them
// once, so each is reported once, by the fire that records it, even when
// another fire applied it (one whose apply had an unknown outcome that no
// read settled, or whose checkpoint failed). Counting at the apply instead
// lost such rows, and alarms that failed reported fewer rows than landed.
func (f *fireRun) recorded() FireResult {
	f.landed = true
	f.res.RowsDelivered = f.res.RowsCleaned
	return *f.res
}

// unrecorded clears what only a landed checkpoint makes true: a later fire
// (or this one's next attempt) records and reports it.
func (r *FireResult) unrecorded() {
	r.RowsDelivered, r.RowsCleaned, r.RowsHeld = 0, 0, 0
	r.TargetsBlocked, r.TargetsDelivered, r.TargetsHeld, r.TargetsQuarantined = 0, 0, 0, 0
}

// roomToHold reports whether moving tw's pages aside (and putting a retry
// marker) fits the checkpoint, taking the room if so.
func (f *fireRun) roomToHold(tw *targetWork, slot *recSlot) bool {
	if slot.holdRoom {
		return true
	}
	// The new marker's put (and per page the put under the held key; a
	// loose target's outbox pages leave through rs.gone, so the delete of
	// each takes no item).
	items, bytes := 1, f.caps.ItemSize(f.source, retryKey(0, tw.target), 0)
	for _, pg := range tw.pages {
		i, b := f.holdExtra(pg)
		items, bytes = items+i, bytes+b
	}
	if items > f.itemsRoom || bytes > f.bytesRoom {
		return false
	}
	f.itemsRoom -= items
	f.bytesRoom -= bytes
	slot.holdRoom = true
	return true
}

// addHeld adds page p's rows to r's held rows; p is newer than every row
// r already holds.
func addHeld(r *targetRec, p Page) {
	if len(p.Rows) == 0 {
		return
	}
	if r.Held == 0 {
		r.HeldFirst, r.HeldMS = p.Rows[0].Seq, p.CommitMS
	}
	r.Held += uint64(len(p.Rows))
	r.HeldLast = max(r.HeldLast, p.Last())
}

// failed records a failed round of tw at r.
func (r *targetRec) failed(tw *targetWork, now int64) {
	r.FailedRounds++
	r.FailedAttempts += max(1, tw.failedCalls)
	e := tw.failure
	e.AtMS = now
	e.Message = sanitize(e.Message, maxErrorMessage)
	r.LastError = &e
}

// succeeded ends r's run of failures (the last error stays for operators).
func (r *targetRec) succeeded() { r.FailedRounds, r.FailedAttempts = 0, 0 }

func (r *targetRec) setState(s TargetState, now int64) {
	if r.State != s {
		r.State, r.SinceMS = s, now
	}
	r.Released = false
	r.RetryMS = 0
}

// sanitize bounds s to n bytes of valid UTF-8 without control characters,
// so its JSON encoding stays within 2n bytes (targetRecMaxBytes).
func sanitize(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c == '<' || c == '>' || c == '&' || c == '\u2028' || c == '\u2029' {
			return ' '
		}
		return c
	}, s)
	return truncateUTF8(s, n)
}

func encodeTargetRec(r targetRec) []byte { return encodeJSON(r) }

func (tw *targetWork) firstUndelivered() (Row, *Page, bool) {
	for _, pg := range tw.pages {
		for _, r := range pg.Rows {
			if r.Seq > tw.dt && r.Seq <= tw.rows[len(tw.rows)-1].Seq {
				return r, pg, true
			}
		}
	}
	return Row{}, nil, false
}
