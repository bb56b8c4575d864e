package relaycore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// RelayHandler pushes a source's queued rows to a separately supplied target
// store. Distinct producers (sources) may upsert the same target key when
// its value is identical; a key that is ever relay-deleted must have exactly
// one producer, so that source's seqs order every update and delete of it.
// Target rh records never expire.
//
// A RelayHandler holds no state between calls; one value may serve many
// sources and concurrent calls. Zero fields get defaults (NoHook, the free
// budget, SystemClock, no kicker, a discarding logger).
type RelayHandler struct {
	Source, Target Store
	Hook           RelayHook
	Budget         RelayBudget
	Clock          Clock
	Kicker         Kicker
	Logger         *slog.Logger
	// ClaimTTL is how long a fire's claim keeps overlapping fires for the
	// same source away. It must exceed a fire's running time; a crashed
	// fire's claim lapses after it. Default 30s.
	ClaimTTL time.Duration
	// BackoffBase and BackoffMax shape the delay after fires that deliver
	// nothing: base × 2^(idle−1), capped at max. Defaults 250ms and 16s,
	// so even a source stuck behind failing targets is retried well within
	// RelayLagBoundMS.
	BackoffBase, BackoffMax time.Duration
}

// FireResult counts one fire's work.
type FireResult struct {
	// Busy means another live fire holds the source's claim (or took it
	// over mid-fire); this fire stopped without a checkpoint.
	Busy bool
	// NewCycle means this fire started a scan cycle; CycleReset that the
	// blocked set overflowed and the cycle was ended early.
	NewCycle, CycleReset bool

	RowsInspected int // rows looked at by the scan (the 4×RowsPerFire budget)
	RowsDelivered int // rows newly applied at targets by this fire
	RowsCleaned   int // rows deleted from the outbox (rh covered them)

	TargetsAttempted int
	TargetsDelivered int // targets whose collected rows are all delivered now
	TargetsBlocked   int // targets that joined the blocked set
	TargetCalls      int // target Apply calls (the CallsPerTarget budget)
	TargetReads      int // target rh reads

	// Blocked, Cursor and CycleEnd describe rs after the fire.
	Blocked          int
	Cursor, CycleEnd uint64
	// Progress: rows delivered or cleaned, or the cursor moved past blocked
	// rows without new failures. Fires without it back off.
	Progress bool
	// More: rows may remain in the outbox.
	More bool
	// NextDueMS is when the source should fire next (now after progress,
	// back-off after none).
	NextDueMS int64
	// Retries counts checkpoint conflicts that made the fire start over.
	Retries int
}

// AlarmResult counts one alarm's fires and what it did with the alarm.
type AlarmResult struct {
	Fires int
	// Busy: another fire held the claim; the alarm record was left as is.
	Busy          bool
	RowsInspected int
	RowsDelivered int
	RowsCleaned   int
	TargetCalls   int
	TargetReads   int
	// TargetsBlock counts targets that joined the blocked set.
	TargetsBlock int
	// Cleared: the outbox was empty and the alarm record was deleted.
	Cleared bool
	// Progress: the alarm's last fire made progress (delivered or cleaned
	// rows, or moved its cursor past blocked rows), so the re-armed alarm is
	// due at once; without it the alarm was re-armed with back-off.
	// Runtimes use it to decide whether to continue the source right away.
	Progress bool
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
}

func (h *RelayHandler) budget() RelayBudget { return h.Budget.orFree() }

func (h *RelayHandler) hook() RelayHook {
	if h.Hook == nil {
		return NoHook{}
	}
	return h.Hook
}

func (h *RelayHandler) clock() Clock {
	if h.Clock == nil {
		return SystemClock{}
	}
	return h.Clock
}

func (h *RelayHandler) claimTTL() time.Duration { return h.ClaimTTLOrDefault() }

// ClaimTTLOrDefault is the claim lifetime in effect (ClaimTTL or 30s).
func (h *RelayHandler) ClaimTTLOrDefault() time.Duration {
	if h.ClaimTTL <= 0 {
		return 30 * time.Second
	}
	return h.ClaimTTL
}

// Backoff is the delay before the next fire after idle consecutive fires
// without delivery.
func (h *RelayHandler) Backoff(idle int) time.Duration {
	base, most := h.BackoffBase, h.BackoffMax
	if base <= 0 {
		base = 250 * time.Millisecond
	}
	if most <= 0 {
		most = 16 * time.Second
	}
	if idle <= 0 {
		return 0
	}
	d := base
	for i := 1; i < idle && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// Fire runs one fire for source: claim the source, scan the cycle, deliver
// to up to TargetsPerFire targets, and checkpoint rs with the cleanup of
// delivered rows in one guarded batch. It does not touch the alarm record
// (Alarm does). Safe to run concurrently with other fires and enqueuers.
func (h *RelayHandler) Fire(ctx context.Context, source Partition) (FireResult, error) {
	return h.fire(ctx, source, newNonce(), false)
}

// Alarm handles one alarm for source: up to FiresPerAlarm fires (stopping
// early when a fire makes no progress or the outbox is drained), then either
// deletes the alarm record, when the outbox is empty, guarded on os and the
// alarm being unchanged so an append landing meanwhile keeps its wake-up, or
// re-arms it (due now after progress, back-off after none) and kicks.
func (h *RelayHandler) Alarm(ctx context.Context, source Partition) (AlarmResult, error) {
	b := h.budget()
	token := newNonce()
	var ar AlarmResult
	var last FireResult
	for i := 0; i < b.FiresPerAlarm; i++ {
		fr, err := h.fire(ctx, source, token, i < b.FiresPerAlarm-1)
		ar.add(fr)
		if err != nil {
			return ar, err
		}
		if fr.Busy {
			ar.Busy = true
			return ar, nil
		}
		last = fr
		ar.Progress = fr.Progress
		if !fr.continues() {
			break
		}
	}
	return ar, h.rearm(ctx, source, last, &ar)
}

// continues is the one rule, shared by the fire (to keep or release its
// claim) and Alarm (to run another fire), for going on within an alarm.
func (f FireResult) continues() bool { return f.More && f.Progress }

func (h *RelayHandler) rearm(ctx context.Context, source Partition, last FireResult, ar *AlarmResult) error {
	log := loggerOr(h.Logger)
	for attempt := 0; attempt < 4; attempt++ {
		osRaw, osFound, err := h.Source.Get(ctx, source, KeyOS)
		if err != nil {
			return fmt.Errorf("alarm %s: read os: %w", source, err)
		}
		alarmRaw, alarmFound, err := h.Source.Get(ctx, source, KeyAlarm)
		if err != nil {
			return fmt.Errorf("alarm %s: read alarm: %w", source, err)
		}
		empty, err := outboxEmpty(ctx, h.Source, source)
		if err != nil {
			return fmt.Errorf("alarm %s: %w", source, err)
		}
		if empty {
			if !alarmFound {
				ar.Cleared = true
				return nil
			}
			caps := h.Source.Capabilities()
			gcPre, gcDel, err := expiredIdem(ctx, h.Source, source, unixMS(h.clock().Now()), 2, caps.ItemSize(source, KeyAlarm, 0))
			if err != nil {
				return fmt.Errorf("alarm %s: %w", source, err)
			}
			err = h.Source.Apply(ctx, source, Batch{
				Preconditions: append([]Precondition{osGuard(osRaw, osFound), {Key: KeyAlarm, Value: alarmRaw}}, gcPre...),
				Writes:        append([]Write{{Key: KeyAlarm, Delete: true}}, gcDel...),
			})
			if err == nil {
				ar.Cleared = true
				return nil
			}
			if _, ok := FailedPrecondition(err); ok || MayBeApplied(err) {
				continue // an append or another alarm got in: look again
			}
			return fmt.Errorf("alarm %s: clear: %w", source, err)
		}
		due := last.NextDueMS
		if due == 0 {
			due = unixMS(h.clock().Now())
		}
		pre := Precondition{Key: KeyAlarm, Absent: true}
		if alarmFound {
			pre = Precondition{Key: KeyAlarm, Value: alarmRaw}
			if a, err := decodeAlarm(alarmRaw); err == nil && a.DueMS == due {
				ar.NextDueMS = due
				h.kick(ctx, source, due)
				return nil
			}
		}
		aw := alarmWrite(due)
		gcPre, gcDel, err := expiredIdem(ctx, h.Source, source, unixMS(h.clock().Now()), 1, h.Source.Capabilities().ItemSize(source, KeyAlarm, len(aw.Value)))
		if err != nil {
			return fmt.Errorf("alarm %s: %w", source, err)
		}
		err = h.Source.Apply(ctx, source, Batch{Preconditions: append([]Precondition{pre}, gcPre...), Writes: append([]Write{aw}, gcDel...)})
		if i, ok := FailedPrecondition(err); ok && i > 0 {
			continue // an expired idempotency record was reused meanwhile: look again
		}
		if _, ok := FailedPrecondition(err); ok {
			// An enqueue re-armed it meanwhile (due at its commit time,
			// never later than ours matters) and kicked: keep theirs.
			return nil
		}
		if err != nil && !MayBeApplied(err) {
			return fmt.Errorf("alarm %s: re-arm: %w", source, err)
		}
		if err != nil {
			log.Warn("relay alarm re-arm outcome unknown; the old alarm or the sweeper covers it", "source", string(source), "err", err)
		}
		ar.NextDueMS = due
		h.kick(ctx, source, due)
		return nil
	}
	return fmt.Errorf("alarm %s: clear: %w", source, ErrContention)
}

func (h *RelayHandler) kick(ctx context.Context, source Partition, due int64) {
	if h.Kicker == nil {
		return
	}
	if err := h.Kicker.Kick(ctx, source, due); err != nil {
		loggerOr(h.Logger).Warn("relay kick failed; the durable alarm still holds", "source", string(source), "due_ms", due, "err", err)
	}
}

// outboxEmpty reports whether source has no row pages.
func outboxEmpty(ctx context.Context, st Store, source Partition) (bool, error) {
	after := ""
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: PagePrefix, End: pageEnd, After: after, Limit: 1})
		if err != nil {
			return false, fmt.Errorf("scan pages %s: %w", source, err)
		}
		if len(pg.Items) > 0 {
			return false, nil
		}
		if pg.Next == "" {
			return true, nil
		}
		after = pg.Next
	}
}

// targetWork is one selected target's share of a fire.
type targetWork struct {
	target Partition
	rows   []Row   // collected rows, ascending seq
	pages  []*Page // pages the rows came from, ascending
	dt     uint64  // delivered through: the target's rh as last known
	failed bool
}

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

const maxFireAttempts = 3

// fire runs one fire under token. keep asks it to keep the claim for the
// next fire of the same alarm when it continues.
func (h *RelayHandler) fire(ctx context.Context, source Partition, token string, keep bool) (FireResult, error) {
	var total FireResult
	spent := fireSpend{calls: map[Partition]int{}}
	for attempt := 0; ; attempt++ {
		res, retry, err := h.fireOnce(ctx, source, token, keep, &spent)
		res.Retries = attempt
		res.RowsDelivered += total.RowsDelivered
		res.TargetCalls += total.TargetCalls
		res.TargetReads += total.TargetReads
		res.RowsInspected += total.RowsInspected
		if err != nil || !retry {
			return res, err
		}
		if attempt+1 >= maxFireAttempts {
			return res, fmt.Errorf("fire %s: checkpoint: %w", source, ErrContention)
		}
		total = res
	}
}

// fireSpend is the budget a fire's attempts have used so far. An attempt
// that starts over after a checkpoint conflict continues with what is left,
// so a fire never makes more than TargetsPerFire×CallsPerTarget target
// calls (nor more than CallsPerTarget per target) or inspects more than
// 4×RowsPerFire rows, however often it starts over: the per-alarm call cap
// holds.
type fireSpend struct {
	calls     map[Partition]int // target apply calls per target
	total     int               // target apply calls
	inspected int               // rows inspected
	// delivered counts rows applied at targets, so that an attempt left with
	// little budget still reports its predecessors' deliveries as progress.
	delivered int
}

// callsLeft is how many more apply calls target may get in this fire.
func (s *fireSpend) callsLeft(b RelayBudget, target Partition) int {
	return max(0, min(b.CallsPerTarget-s.calls[target], b.targetCallsPerFire()-s.total))
}

// fireOnce is one attempt; retry reports an rs conflict at checkpoint with
// no live competing claim (the target side is idempotent, so starting over
// is safe). spent carries the budget used by earlier attempts.
func (h *RelayHandler) fireOnce(ctx context.Context, source Partition, token string, keep bool, spent *fireSpend) (res FireResult, retry bool, err error) {
	b := h.budget()
	now := unixMS(h.clock().Now())
	rs, rsRaw, os, busy, err := h.claim(ctx, source, token, now)
	if err != nil || busy {
		res.Busy = busy
		return res, false, err
	}
	res.NewCycle = rs.newCycle
	cur := rs.RelayState

	// Scan.
	caps := h.Source.Capabilities()
	pagesRoom, bytesRoom := 1<<30, 1<<30
	if caps.MaxBatchItems > 0 {
		pagesRoom = caps.MaxBatchItems - 1
	}
	if caps.MaxBatchBytes > 0 {
		bytesRoom = caps.MaxBatchBytes - caps.ItemSize(source, KeyRS, rsMaxBytes)
	}
	blocked := make(map[Partition]bool, len(cur.Blocked))
	for _, t := range cur.Blocked {
		blocked[t] = true
	}
	var sel []*targetWork
	byTarget := map[Partition]*targetWork{}
	inspectLeft, rowsLeft := max(0, b.inspectPerFire()-spent.inspected), b.RowsPerFire
	stop, stopFrom := cur.CycleEnd, ""
	start := cur.From
	if start < PagePrefix {
		start = PagePrefix
	}
	end := PageKey(cur.CycleEnd + 1)
	after := ""
	stopAt := func(seq uint64, key string) { stop, stopFrom = seq, key }
	var prevLast uint64 // last seq of the previous page scanned
scan:
	for cur.Cursor < cur.CycleEnd {
		pg, err := h.Source.Scan(ctx, source, ScanRequest{Start: start, End: end, After: after, Limit: b.TargetsPerFire + 1})
		if err != nil {
			return res, false, fmt.Errorf("fire %s: scan: %w", source, err)
		}
		for _, it := range pg.Items {
			page, err := DecodePage(it.Key, it.Value)
			if err != nil {
				return res, false, fmt.Errorf("fire %s: %w", source, err)
			}
			// A page keyed within the cycle came from a batch committed
			// before the cycle started, and pages hold disjoint ascending
			// seq ranges in key order. Delivering a row that breaks this
			// would move rh past seqs that later rows get, and those would
			// be skipped as applied: fail closed instead.
			if page.Last() > cur.CycleEnd || page.First <= prevLast {
				return res, false, fmt.Errorf("fire %s: %w: page %s holds seqs %d..%d, outside the cycle (through %d) or not after seq %d",
					source, ErrCorruptRecord, page.Key, page.First, page.Last(), cur.CycleEnd, prevLast)
			}
			prevLast = page.Last()
			i, _ := slices.BinarySearchFunc(page.Rows, cur.Cursor+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
			rows := page.Rows[i:]
			if len(rows) == 0 {
				continue // rows at or below the cursor: blocked targets'
			}
			if blocked[page.Target] {
				n := min(len(rows), inspectLeft)
				inspectLeft -= n
				spent.inspected += n
				res.RowsInspected += n
				if n < len(rows) {
					stopAt(rows[0].Seq+uint64(n)-1, page.Key)
					break scan
				}
				continue
			}
			tw := byTarget[page.Target]
			// The checkpoint deletes the page or rewrites its remaining rows;
			// a rewrite may compress worse than the stored page, never beyond
			// the rows with full keys uncompressed.
			size := caps.ItemSize(source, page.Key, max(len(it.Value), pageRewriteBound(page)))
			if (tw == nil && len(sel) == b.TargetsPerFire) || pagesRoom == 0 || size > bytesRoom {
				stopAt(rows[0].Seq-1, page.Key)
				break scan
			}
			n := min(len(rows), inspectLeft, rowsLeft)
			if n == 0 {
				stopAt(rows[0].Seq-1, page.Key)
				break scan
			}
			if tw == nil {
				tw = &targetWork{target: page.Target}
				byTarget[page.Target] = tw
				sel = append(sel, tw)
			}
			pageCopy := page
			tw.pages = append(tw.pages, &pageCopy)
			tw.rows = append(tw.rows, rows[:n]...)
			pagesRoom--
			bytesRoom -= size
			inspectLeft -= n
			spent.inspected += n
			rowsLeft -= n
			res.RowsInspected += n
			if n < len(rows) {
				stopAt(rows[n-1].Seq, page.Key)
				break scan
			}
		}
		if pg.Next == "" {
			break
		}
		after = pg.Next
	}

	// Deliver, one target at a time.
	for _, tw := range sel {
		res.TargetsAttempted++
		h.deliver(ctx, source, tw, &res, b, spent)
	}

	// New rs.
	next := cur
	next.Version++
	next.Cursor, next.From = stop, stopFrom
	newBlocked := slices.Clone(cur.Blocked)
	for _, tw := range sel {
		if tw.failed {
			newBlocked = append(newBlocked, tw.target)
			res.TargetsBlocked++
			continue
		}
		if r, pg, ok := tw.firstUndelivered(); ok {
			if r.Seq-1 < next.Cursor {
				next.Cursor, next.From = r.Seq-1, pg.Key
			}
		} else {
			res.TargetsDelivered++
		}
	}
	slices.Sort(newBlocked)
	next.Blocked = slices.Compact(newBlocked)
	if len(next.Blocked) > MaxBlockedTargets {
		res.CycleReset = true
		next.Cursor, next.From, next.Blocked = next.CycleEnd, "", nil
	}
	if next.Cursor >= next.CycleEnd {
		next.From = ""
	}

	// Cleanup writes: delete delivered pages, rewrite partly delivered ones.
	writes := []Write{{Key: KeyRS}}
	var codec pageCodec
	for _, tw := range sel {
		for _, pg := range tw.pages {
			i, _ := slices.BinarySearchFunc(pg.Rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
			if i == 0 {
				continue
			}
			res.RowsCleaned += i
			if i == len(pg.Rows) {
				writes = append(writes, Write{Key: pg.Key, Delete: true})
				continue
			}
			rest := *pg
			rest.Rows = pg.Rows[i:]
			rest.First = rest.Rows[0].Seq
			// Never longer than the page's rows with full keys, which the
			// planner kept within the item limit.
			writes = append(writes, Write{Key: pg.Key, Value: codec.encode(rest)})
		}
	}

	// spent.delivered includes this fire's earlier attempts.
	res.Progress = spent.delivered > 0 || res.RowsCleaned > 0 ||
		(!res.NewCycle && next.Cursor > cur.Cursor && res.TargetsBlocked == 0)
	if res.Progress && (spent.delivered > 0 || res.RowsCleaned > 0) {
		next.Idle = 0
	} else if !res.Progress {
		next.Idle++
	}
	completed := next.Cursor >= next.CycleEnd
	res.More = !(completed && !res.CycleReset && len(next.Blocked) == 0 && os.NextSeq-1 == next.CycleEnd)
	if res.Progress {
		res.NextDueMS = now
	} else {
		res.NextDueMS = now + h.Backoff(next.Idle).Milliseconds()
	}
	next.Claim = nil
	if keep && res.continues() {
		next.Claim = &Claim{Owner: token, UntilMS: unixMS(h.clock().Now()) + h.claimTTL().Milliseconds()}
	}
	res.Blocked, res.Cursor, res.CycleEnd = len(next.Blocked), next.Cursor, next.CycleEnd
	nextRaw := encodeJSON(next)
	writes[0].Value = nextRaw

	err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{{Key: KeyRS, Value: rsRaw}}, Writes: writes})
	if err == nil {
		return res, false, nil
	}
	_, cond := FailedPrecondition(err)
	if !cond && !MayBeApplied(err) {
		return res, false, fmt.Errorf("fire %s: checkpoint: %w", source, err)
	}
	// Conflict or unknown outcome: look at rs.
	raw, found, rerr := h.Source.Get(ctx, source, KeyRS)
	if rerr != nil {
		return res, false, fmt.Errorf("fire %s: checkpoint: %v; re-read rs: %w", source, err, rerr)
	}
	if found && bytes.Equal(raw, nextRaw) {
		return res, false, nil // it landed
	}
	if found {
		if other, derr := decodeRS(raw); derr == nil && other.Claim != nil && other.Claim.Owner != token && other.Claim.UntilMS > unixMS(h.clock().Now()) {
			res.Busy = true // another fire took over; our deliveries are idempotent
			return res, false, nil
		}
	}
	loggerOr(h.Logger).Info("relay checkpoint conflict; starting the fire over", "source", string(source), "err", err)
	res.RowsCleaned, res.TargetsBlocked, res.TargetsDelivered, res.TargetsAttempted = 0, 0, 0, 0
	return res, true, nil
}

// rsMaxBytes bounds an encoded rs: a full blocked set of longest names, each
// at its worst encoding (blockedNameMaxJSON), plus the scalar fields.
const rsMaxBytes = 512 + (MaxBlockedTargets+1)*blockedNameMaxJSON

type claimedRS struct {
	RelayState
	newCycle bool
}

// claim reads rs and os and takes the source's fire claim, starting a new
// cycle when rs is absent or completed. busy reports another live claim.
func (h *RelayHandler) claim(ctx context.Context, source Partition, token string, now int64) (claimedRS, []byte, OutboxState, bool, error) {
	for attempt := 0; attempt < 4; attempt++ {
		raw, found, err := h.Source.Get(ctx, source, KeyRS)
		if err != nil {
			return claimedRS{}, nil, OutboxState{}, false, fmt.Errorf("fire %s: read rs: %w", source, err)
		}
		var rs RelayState
		if found {
			if rs, err = decodeRS(raw); err != nil {
				return claimedRS{}, nil, OutboxState{}, false, fmt.Errorf("fire %s: %w", source, err)
			}
		}
		if c := rs.Claim; c != nil && c.Owner != token && c.UntilMS > now {
			return claimedRS{}, nil, OutboxState{}, true, nil
		}
		osRaw, osFound, err := h.Source.Get(ctx, source, KeyOS)
		if err != nil {
			return claimedRS{}, nil, OutboxState{}, false, fmt.Errorf("fire %s: read os: %w", source, err)
		}
		os, err := decodeOS(osRaw, osFound)
		if err != nil {
			return claimedRS{}, nil, OutboxState{}, false, fmt.Errorf("fire %s: %w", source, err)
		}
		newCycle := !found || rs.Completed()
		if !newCycle && rs.Claim != nil && rs.Claim.Owner == token {
			return claimedRS{RelayState: rs}, raw, os, false, nil // kept from our previous fire
		}
		next := rs
		next.Version++
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
			return claimedRS{RelayState: next, newCycle: newCycle}, nextRaw, os, false, nil
		}
		if _, ok := FailedPrecondition(err); ok || MayBeApplied(err) {
			if MayBeApplied(err) {
				if cur, ok, rerr := h.Source.Get(ctx, source, KeyRS); rerr == nil && ok && bytes.Equal(cur, nextRaw) {
					return claimedRS{RelayState: next, newCycle: newCycle}, nextRaw, os, false, nil
				}
			}
			continue
		}
		return claimedRS{}, nil, OutboxState{}, false, fmt.Errorf("fire %s: claim: %w", source, err)
	}
	return claimedRS{}, nil, OutboxState{}, true, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// deliver applies tw's rows newer than the target's rh, in ascending seq,
// in as many target batches as the limits and CallsPerTarget allow. It sets
// tw.dt to the rh it last knew and tw.failed on a delivery or hook failure.
func (h *RelayHandler) deliver(ctx context.Context, source Partition, tw *targetWork, res *FireResult, b RelayBudget, spent *fireSpend) {
	log := loggerOr(h.Logger).With("source", string(source), "target", string(tw.target))
	fail := func(msg string, err error) {
		log.Warn("relay target blocked: "+msg, "err", err)
		tw.failed = true
	}
	rhKey := RHKey(source)
	readRH := func() ([]byte, bool, uint64, error) {
		res.TargetReads++
		raw, found, err := h.Target.Get(ctx, tw.target, rhKey)
		if err != nil {
			return nil, false, 0, err
		}
		v, err := decodeRH(raw, found)
		return raw, found, v, err
	}
	raw, found, rh, err := readRH()
	if err != nil {
		fail("read rh", err)
		return
	}
	tw.dt = rh
	newer := func(rows []Row) []Row {
		i, _ := slices.BinarySearchFunc(rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
		return rows[i:]
	}
	pending := newer(tw.rows)
	tc := h.Target.Capabilities()
	attempt := 0
	for len(pending) > 0 {
		if spent.callsLeft(b, tw.target) == 0 {
			return // budget spent; not a failure: the cursor pauses before these rows
		}
		attempt++
		n := fitRows(source, tw.target, pending, tc, 0, 0)
		if n == 0 {
			// Enqueue validation keeps every row within one target batch
			// of the limits it was given; a target store with smaller
			// limits (or a hostile page) can still hold one that is not.
			fail("row does not fit one target batch", fmt.Errorf("row %d: %w", pending[0].Seq, ErrBatchTooLarge))
			return
		}
		var hookWrites []Write
		for {
			items, size := targetLoad(source, tw.target, pending[:n], tc)
			req := HookRequest{Source: source, Target: tw.target, Rows: slices.Clone(pending[:n]), Attempt: attempt,
				RoomItems: room(tc.MaxBatchItems, items), RoomBytes: room(tc.MaxBatchBytes, size)}
			hookWrites, err = h.hook().BeforeApply(ctx, req)
			if err != nil {
				fail("hook", err)
				return
			}
			if err := checkHookWrites(hookWrites, pending[:n]); err != nil {
				fail("hook writes", err)
				return
			}
			extra := 0
			for _, w := range hookWrites {
				extra += tc.ItemSize(tw.target, w.Key, len(w.Value))
			}
			m := fitRows(source, tw.target, pending[:n], tc, len(hookWrites), extra)
			if m == n {
				break
			}
			if m == 0 {
				fail("hook additions leave no room for a row", ErrBatchTooLarge)
				return
			}
			n = m // shrink and ask the hook again for the smaller group
		}
		last := pending[n-1].Seq
		batch := targetBatch(rhKey, raw, found, last, pending[:n], hookWrites)
		if err := tc.Check(tw.target, batch); err != nil {
			fail("plan target batch", err)
			return
		}
		spent.calls[tw.target]++
		spent.total++
		res.TargetCalls++
		err := h.Target.Apply(ctx, tw.target, batch)
		if err == nil {
			res.RowsDelivered += n
			spent.delivered += n
			tw.dt, raw, found = last, encodeRH(last), true
			pending = pending[n:]
			continue
		}
		_, cond := FailedPrecondition(err)
		if !cond && !MayBeApplied(err) {
			fail("apply", err)
			return
		}
		// rh moved (another deliverer) or the outcome is unknown: rh says
		// what is applied, because every target batch advances it.
		var rerr error
		raw, found, rh, rerr = readRH()
		if rerr != nil {
			fail("re-read rh", rerr)
			return
		}
		if rh >= last && MayBeApplied(err) {
			res.RowsDelivered += n
			spent.delivered += n
		}
		tw.dt = max(tw.dt, rh)
		pending = newer(pending)
	}
}

func room(limit, used int) int {
	if limit <= 0 {
		return 1 << 30
	}
	return limit - used
}

// coalesce folds rows (ascending seq) into one write per key: the newest
// put or delete wins, because a transaction cannot touch a key twice.
func coalesce(rows []Row) map[string]Write {
	out := map[string]Write{}
	for _, r := range rows {
		for _, kv := range r.Puts {
			out[kv.Key] = Write{Key: kv.Key, Value: kv.Value}
		}
		for _, k := range r.Deletes {
			out[k] = Write{Key: k, Delete: true}
		}
	}
	return out
}

// targetLoad is the items and bytes of rows' coalesced writes plus rh.
func targetLoad(source, target Partition, rows []Row, tc Capabilities) (int, int) {
	items, size := 1, tc.ItemSize(target, RHKey(source), 20)
	for _, w := range coalesce(rows) {
		items++
		size += tc.ItemSize(target, w.Key, len(w.Value))
	}
	return items, size
}

// fitRows is how many leading rows fit one target batch together with rh
// and extraItems/extraBytes of hook writes.
func fitRows(source, target Partition, rows []Row, tc Capabilities, extraItems, extraBytes int) int {
	sizes := map[string]int{}
	items, total := 1+extraItems, tc.ItemSize(target, RHKey(source), 20)+extraBytes
	for i, r := range rows {
		addItems, addBytes := 0, 0
		visit := func(k string, vlen int) {
			s := tc.ItemSize(target, k, vlen)
			if old, ok := sizes[k]; ok {
				addBytes += s - old
			} else {
				addItems++
				addBytes += s
			}
		}
		for _, kv := range r.Puts {
			visit(kv.Key, len(kv.Value))
		}
		for _, k := range r.Deletes {
			visit(k, 0)
		}
		if (tc.MaxBatchItems > 0 && items+addItems > tc.MaxBatchItems) || (tc.MaxBatchBytes > 0 && total+addBytes > tc.MaxBatchBytes) {
			return i
		}
		items, total = items+addItems, total+addBytes
		for _, kv := range r.Puts {
			sizes[kv.Key] = tc.ItemSize(target, kv.Key, len(kv.Value))
		}
		for _, k := range r.Deletes {
			sizes[k] = tc.ItemSize(target, k, 0)
		}
	}
	return len(rows)
}

func checkHookWrites(ws []Write, rows []Row) error {
	keys := coalesce(rows)
	seen := map[string]bool{}
	for _, w := range ws {
		switch {
		case w.Key == "":
			return fmt.Errorf("%w: hook write with an empty key", ErrInvalidBatch)
		case strings.HasPrefix(w.Key, ReservedPrefix):
			return fmt.Errorf("%w: hook write to reserved key %q", ErrInvalidBatch, w.Key)
		case seen[w.Key]:
			return fmt.Errorf("%w: hook writes key %q twice", ErrInvalidBatch, w.Key)
		}
		if _, ok := keys[w.Key]; ok {
			return fmt.Errorf("%w: hook writes key %q that a row writes", ErrInvalidBatch, w.Key)
		}
		seen[w.Key] = true
	}
	return nil
}

// targetBatch guards rh on the value read and advances it to last, with the
// rows' coalesced writes and the hook's writes, atomically.
func targetBatch(rhKey string, rhRaw []byte, rhFound bool, last uint64, rows []Row, hookWrites []Write) Batch {
	pre := Precondition{Key: rhKey, Absent: true}
	if rhFound {
		pre = Precondition{Key: rhKey, Value: rhRaw}
	}
	cw := coalesce(rows)
	writes := make([]Write, 0, len(cw)+len(hookWrites)+1)
	for _, w := range cw {
		writes = append(writes, w)
	}
	slices.SortFunc(writes, func(a, b Write) int { return strings.Compare(a.Key, b.Key) })
	writes = append(writes, hookWrites...)
	writes = append(writes, Write{Key: rhKey, Value: encodeRH(last)})
	return Batch{Preconditions: []Precondition{pre}, Writes: writes}
}
