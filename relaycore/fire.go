package relaycore

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// RelayHandler is the engine an embedder wires once: Enqueue commits rows
// to a source's outbox in Source (and kicks Kicker), Alarm and Fire push
// them to the separately supplied Target store. Distinct producers (sources) may upsert the same target key when
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
	// QuarantineAfter is how many consecutive failed delivery rounds (a
	// fire's turn at a target: once per scan cycle while it is blocked, or
	// one retry of its held rows) quarantine a target automatically.
	// Default DefaultQuarantineAfter; negative: never automatically.
	QuarantineAfter int
	// RetryBase and RetryMax shape when a target whose rows are held for
	// retry (it failed while the blocked set was full) is tried again:
	// base × 2^(rounds−1), capped at max. Defaults 1s and 5min.
	RetryBase, RetryMax time.Duration
	// DeliverConcurrency is how many targets a fire delivers to at once
	// (0 or 1: one after another). Each target's rows still go in seq
	// order in batches of their own; only different targets overlap.
	// Worth it on a store whose concurrent commits share an fsync
	// (infra/bolt's group commit), where a fire's target batches then cost
	// about one commit instead of one each. With more than 1 the Hook is
	// called concurrently for different targets. The deterministic
	// simulation runs with 1.
	DeliverConcurrency int

	// Enqueue's tuning; zero values take the defaults. PageBytes is the
	// fill target of a row page as the store's item size (default 8192: a
	// full page bills at most 8 KB). SkewMargin is kept between a lease's
	// expiry and the last moment an enqueue under it may write, so a
	// holder whose clock runs behind stops before its successor may take
	// over (default 2s). IdempotencyTTL is how long an idempotency record
	// answers retries (default DefaultIdempotencyTTL). MaxReplans bounds
	// the os races one Enqueue tolerates before ErrContention (default 64).
	PageBytes      int
	SkewMargin     time.Duration
	IdempotencyTTL time.Duration
	MaxReplans     int
}

// DefaultQuarantineAfter is RelayHandler.QuarantineAfter's default: a target
// failing 10 rounds in a row (at least a few minutes of failures with the
// default back-off) is quarantined.
const DefaultQuarantineAfter = 10

func (h *RelayHandler) quarantineAfter() int {
	switch {
	case h.QuarantineAfter < 0:
		return math.MaxInt
	case h.QuarantineAfter == 0:
		return DefaultQuarantineAfter
	}
	return h.QuarantineAfter
}

// RetryDelay is the delay before held rows are retried after rounds
// consecutive failed rounds.
func (h *RelayHandler) RetryDelay(rounds int) time.Duration {
	base, most := h.RetryBase, h.RetryMax
	if base <= 0 {
		base = time.Second
	}
	if most <= 0 {
		most = 5 * time.Minute
	}
	d := base
	for i := 1; i < rounds && d < most; i++ {
		d *= 2
	}
	return min(d, most)
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
	a.TargetsHeld += f.TargetsHeld
	a.TargetsQuarantined += f.TargetsQuarantined
	a.RowsHeld += f.RowsHeld
	a.TargetsRedriven += f.TargetsRedriven
	if !f.Busy {
		a.Blocked, a.Hold = f.Blocked, f.Hold
	}
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

// targetWork is one selected target's share of a fire.
type targetWork struct {
	target Partition
	rows   []Row   // collected rows, ascending seq
	pages  []*Page // pages the rows came from, ascending
	dt     uint64  // delivered through: the target's rh as last known
	failed bool
	// failure describes the failure; failedCalls counts failed applies.
	failure     LastError
	failedCalls int
	// held: the rows come from held pages (a retry or redrive), not the
	// outbox scan; heldNext/heldNextMS: the first held page it did not
	// collect (0: none).
	held       bool
	heldNext   uint64
	heldNextMS int64
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
// next fire of the same alarm when it continues. A fire that fails releases
// its claim on the way out (releaseClaim).
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

// rsMaxBytes bounds an encoded rs: a full blocked set of longest names, each
// at its worst encoding (blockedNameMaxJSON), plus the scalar fields.
const rsMaxBytes = 512 + (MaxBlockedTargets+1)*blockedNameMaxJSON
