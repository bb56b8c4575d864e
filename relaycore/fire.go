package relaycore

import (
	"context"
	"fmt"
	"sync"
)

// Fire runs one fire for source: claim the source, scan the cycle, deliver
// to up to TargetsPerFire targets, and checkpoint rs with the cleanup of
// delivered rows in one guarded batch. It does not touch the alarm record
// (Alarm does). Safe to run concurrently with other fires and enqueuers.
func (h *RelayHandler) Fire(ctx context.Context, source Partition) (FireResult, error) {
	if err := h.needStores("Fire", true); err != nil {
		return FireResult{}, err
	}
	return h.fire(ctx, source, newNonce(), false, false, &goneMemo{})
}

const maxFireAttempts = 3

// fire runs one fire under token. keep asks it to keep the claim for the
// next fire of the same alarm when it continues; early says the previous
// fire of the alarm kept it for this one (claimReads.early). A fire that
// fails releases its claim on the way out (releaseClaim).
func (h *RelayHandler) fire(ctx context.Context, source Partition, token string, keep, early bool, memo *goneMemo) (FireResult, error) {
	var total FireResult
	spent := fireSpend{calls: map[Partition]int{}}
	for attempt := 0; ; attempt++ {
		// An attempt after a conflict met another writer's rs: it reads
		// after rs.
		res, retry, err := h.fireOnce(ctx, source, token, keep, early && attempt == 0, &spent, memo)
		res.Retries = attempt
		res.RowsDelivered += total.RowsDelivered
		res.TargetCalls += total.TargetCalls
		res.TargetReads += total.TargetReads
		res.RowsInspected += total.RowsInspected
		if err != nil {
			h.releaseClaim(ctx, source, token)
			return res, err
		}
		if !retry {
			return res, nil
		}
		if attempt+1 >= maxFireAttempts {
			h.releaseClaim(ctx, source, token)
			return res, fmt.Errorf("fire %s: checkpoint: %w", source, ErrContention)
		}
		total = res
	}
}

// fireOnce is one attempt of a fire, its steps in order, each in the file
// named for it; retry reports an rs conflict at checkpoint with no live
// competing claim (the target side is idempotent, so starting over is
// safe). spent carries the budget used by earlier attempts.
func (h *RelayHandler) fireOnce(ctx context.Context, source Partition, token string, keep, early bool, spent *fireSpend, memo *goneMemo) (res FireResult, retry bool, err error) {
	f := &fireRun{h: h, ctx: ctx, source: source, token: token, keep: keep, early: early, spent: spent, res: &res, memo: memo}
	// claim.go: take the source's claim (or meet a live one: busy) and
	// read rs, os and q.
	if busy, err := f.claim(); err != nil || busy || f.unknown {
		return res, false, err
	}
	// collect.go: select the work, held rows that are due (redrive.go) and
	// the outbox scan (scan.go) taking turns, within the checkpoint's room.
	if err := f.collect(); err != nil {
		return res, false, err
	}
	// deliver.go: apply the collected rows at their targets.
	f.deliver()
	// checkpoint.go: record it all in one batch guarded on rs.
	if res, retry, err = f.checkpoint(); err != nil || retry || !f.landed {
		return res, retry, err
	}
	// gone.go: delete the pages the checkpoint listed in rs.gone.
	if err := h.deletePages(ctx, source, f.gone); err != nil {
		return res, false, fmt.Errorf("fire %s: %w (the rows are recorded delivered; the next claim deletes the pages)", source, err)
	}
	memo.deleted = f.gone
	return res, false, nil
}

// fireRun is one attempt of a fire: what it claimed, what it read, the work
// it selected and the room left in its checkpoint batch.
type fireRun struct {
	h      *RelayHandler
	ctx    context.Context
	source Partition
	token  string // the claim's owner
	keep   bool   // keep the claim for the alarm's next fire if it continues
	// unknown: the source has neither rs nor os (claimed.unknown); the
	// attempt ends at once, having written nothing.
	unknown bool
	// early: the alarm's previous fire kept the claim for this one
	// (claimReads.early).
	early bool
	b     RelayBudget
	now   int64
	caps  Capabilities
	res   *FireResult
	spent *fireSpend
	start claimed
	cur   RelayState

	recs map[Partition]*recSlot // target records read this attempt

	redrive []*targetWork // targets served from held pages (retries, redrives)
	sel     []*targetWork // targets selected by the outbox scan
	// backoff: targets the scan skipped as blocked without a call, their
	// back-off after a failed round not passed yet (backingOff).
	backoff []Partition
	moves   []heldMove // outbox pages moved aside (targets that hold)

	stop     uint64 // the scan's stop: the new cursor unless a target pauses it earlier
	stopFrom string

	// dueLeft: due retry markers this attempt did not serve (the source has
	// more to do); nextDue: the earliest marker not yet due.
	dueLeft bool
	nextDue int64
	// markers: the due retry markers, read with the claim.
	markers []dueMarker
	// heldFirst: due held rows went first this fire (collect's turns);
	// the checkpoint records it in rs when held rows were due.
	heldFirst bool
	turnTaken bool

	itemsRoom, bytesRoom int
	// loose: the source store deletes finished pages loosely (gone.go);
	// goneRoom is the room (bytes) left for the checkpoint's lists of
	// them in rs, and gone, once the checkpoint is built, their keys.
	loose    bool
	goneRoom int
	gone     []string
	memo     *goneMemo
	landed   bool // the checkpoint landed
	// capItems/capBytes (when > 0) bound what the current collection
	// phase may reserve beyond its first reservation (collect's fair
	// split); usedItems/usedBytes count what it reserved.
	capItems, capBytes   int
	usedItems, usedBytes int
}

// targetWork is one selected target's share of a fire.
type targetWork struct {
	target Partition
	rows   []Row   // collected rows, ascending seq
	pages  []*Page // pages the rows came from, ascending
	dt     uint64  // delivered through: the target's rh as last known
	// carried is the target's rh as the source last recorded it (its
	// record's Through, rs's folded entry): deliver guards the first target
	// batch on it instead of reading rh (deliver.go, carriedRH).
	carried uint64
	failed  bool
	// failure describes the failure; failedCalls counts failed applies.
	failure     LastError
	failedCalls int
	// held: the rows come from held pages (a retry or redrive), not the
	// outbox scan; heldNext/heldNextMS: the first held page it did not
	// collect (0: none).
	held       bool
	heldNext   uint64
	heldNextMS int64
	// loose: the target's outbox pages leave through rs.gone (gone.go)
	// when it finishes them or moves them aside; looseHeld: the held
	// pages (of a redrive) that leave through rs.gone_held when finished.
	loose     bool
	looseHeld map[string]bool
}

// fireSpend is the budget a fire's attempts have used so far. An attempt
// that starts over after a checkpoint conflict continues with what is left,
// so a fire never makes more than TargetsPerFire×CallsPerTarget target
// calls (nor more than CallsPerTarget per target) or inspects more than
// 4×RowsPerFire rows, however often it starts over: the per-alarm call cap
// holds.
type fireSpend struct {
	// mu guards the fields and the fire's result counters while targets
	// are delivered concurrently (RelayHandler.DeliverConcurrency).
	mu        sync.Mutex
	calls     map[Partition]int // target apply calls per target
	total     int               // target apply calls
	inspected int               // rows inspected
	// delivered counts rows applied at targets, so that an attempt left with
	// little budget still reports its predecessors' deliveries as progress.
	delivered int
}

// reserve takes one apply call of target's budget, if any is left.
func (s *fireSpend) reserve(b RelayBudget, target Partition) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.callsLeft(b, target) == 0 {
		return false
	}
	s.calls[target]++
	s.total++
	return true
}

// left is callsLeft under mu: how many more apply calls target may get
// in this fire, as deliveries running at once see it.
func (s *fireSpend) left(b RelayBudget, target Partition) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.callsLeft(b, target)
}

// unreserve gives back a reserved call that was not made.
func (s *fireSpend) unreserve(target Partition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[target]--
	s.total--
}

// count updates the fire's counters under mu.
func (s *fireSpend) count(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// callsLeft is how many more apply calls target may get in this fire.
func (s *fireSpend) callsLeft(b RelayBudget, target Partition) int {
	return max(0, min(b.CallsPerTarget-s.calls[target], b.targetCallsPerFire()-s.total))
}

// FireResult counts one fire's work.
type FireResult struct {
	// Busy means another live fire holds the source's claim (or took it
	// over mid-fire); this fire stopped without a checkpoint.
	Busy bool
	// BusyRetryMS (when Busy) is when the source is worth trying again:
	// when the claim met lapses, or in a moment when an operator action
	// holds it (0: not known).
	BusyRetryMS int64
	// NewCycle means this fire started a scan cycle.
	NewCycle bool

	RowsInspected int // rows looked at by the scan (the 4×RowsPerFire budget)
	// RowsDelivered counts the rows whose delivery this fire recorded: its
	// checkpoint took them out of the outbox (or held pages) because their
	// target's rh covers them. That is usually the fire that applied them;
	// rows applied by a fire whose apply outcome stayed unknown or whose
	// checkpoint failed are counted by the fire that records them, so every
	// delivered row is counted once and sums over alarms are exact (0 for
	// a fire whose checkpoint did not land). Held rows a Skip finds already
	// applied leave with the skip, uncounted here. RowsCleaned is the same
	// count.
	RowsDelivered int
	RowsCleaned   int

	TargetsAttempted int
	TargetsDelivered int // targets whose collected rows are all delivered now
	TargetsBlocked   int // targets that joined the blocked set
	// TargetsHeld: failing targets whose rows were moved aside for a later
	// retry because the blocked set was full; TargetsQuarantined: targets
	// quarantined automatically (QuarantineAfter failed rounds).
	TargetsHeld, TargetsQuarantined int
	// RowsHeld counts rows moved out of the outbox scan into held pages
	// (quarantined, paused or held targets); they are not delivered and
	// cost no target budget.
	RowsHeld int
	// TargetsRedriven counts targets whose held rows this fire tried.
	TargetsRedriven int
	TargetCalls     int // target Apply calls (the CallsPerTarget budget)
	TargetReads     int // target rh reads

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
	// NextRetryMS is the earliest retry marker the fire left (0: none
	// known): when held rows are next due.
	NextRetryMS int64
	// Hold is the source's hold summary (q) as the fire left it: held rows,
	// quarantined and paused targets (for metrics and alarms).
	Hold HoldSummary
	// sweptMS is rs.SweptMS as the checkpoint wrote it (sweepKnown), so
	// the alarm decides whether an idle sweep is due without reading rs.
	sweptMS    int64
	sweepKnown bool
	// sawNextSeq is os.next as the fire read it: rows at or after it were
	// committed while it ran (committedSince).
	sawNextSeq uint64
}
