package relaycore

import (
	"fmt"
	"log/slog"
	"math"
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
// sources and concurrent calls. Zero fields get defaults (no hook, the free
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
	// nothing: base × 2^(idle−1), capped at max, and, the same way, a
	// failing target's next attempt after its last failed round: base ×
	// 2^(rounds−1) (until then scans skip it as blocked). Defaults 250ms
	// and 16s, so even a source stuck behind failing targets is retried
	// well within RelayLagBoundMS.
	BackoffBase, BackoffMax time.Duration
	// QuarantineAfter is how many consecutive failed delivery rounds (a
	// fire's turn at a target: an attempt from the outbox, at most one per
	// scan cycle and per back-off, or one retry of its held rows)
	// quarantine a target automatically.
	// Default 10; negative: never automatically.
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
	// called concurrently for different targets, and a fire also makes
	// its independent reads at once (rs, os and q, its due retry markers:
	// a request's latency in front of each fire instead of three). At 0
	// or 1 every store call of a fire is made one after another; the
	// deterministic simulation runs so.
	DeliverConcurrency int
	// IdleTargetTTL is how long a target with nothing pending or held,
	// active and without a failure run must see no activity (no rows
	// committed, no failure, no operator action) before an
	// alarm collects its figures (its os and rs entries and t/<hex>/e and
	// s records), so a source's storage follows the targets in use, not
	// every target it ever relayed to; the target then reads as unknown
	// until rows are enqueued for it again. Alarms look at most every
	// eighth of it. Default 7 days; negative: never.
	IdleTargetTTL time.Duration

	// Enqueue's tuning; zero values take the defaults. PageBytes is the
	// fill target of a row page as the store's item size (default 8192: a
	// full page bills at most 8 KB). SkewMargin is kept between a lease's
	// expiry and the last moment an enqueue under it may write, so a
	// holder whose clock runs behind stops before its successor may take
	// over (default 2s). IdempotencyTTL is how long an idempotency record
	// answers retries (default 24h). MaxReplans bounds
	// the os races one Enqueue tolerates before ErrContention (default 64).
	PageBytes      int
	SkewMargin     time.Duration
	IdempotencyTTL time.Duration
	MaxReplans     int
}

// defaultQuarantineAfter is RelayHandler.QuarantineAfter's default: a target
// failing 10 rounds in a row (about a minute of failures: a failing
// target is retried BackoffBase × 2^(rounds−1) after its last failure,
// capped at BackoffMax, whatever its source's other traffic) is
// quarantined.
const defaultQuarantineAfter = 10

func (h *RelayHandler) quarantineAfter() int {
	switch {
	case h.QuarantineAfter < 0:
		return math.MaxInt
	case h.QuarantineAfter == 0:
		return defaultQuarantineAfter
	}
	return h.QuarantineAfter
}

// retryDelay is the delay before held rows are retried after rounds
// consecutive failed rounds.
func (h *RelayHandler) retryDelay(rounds int) time.Duration {
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

func (h *RelayHandler) budget() RelayBudget { return h.Budget.orFree() }

// needStores refuses op on a handler without the stores it needs, before
// anything is read or written: a producer's handler needs only Source
// (Enqueue checks rows against Source's capabilities when Target is nil),
// one that fires needs Target too. Without this a nil Target surfaced as a
// panic in the first delivery, after Enqueue had accepted the rows: a crash
// loop for an embedder's alarm clock.
func (h *RelayHandler) needStores(op string, target bool) error {
	switch {
	case h == nil:
		return fmt.Errorf("relaycore: %s on a nil *RelayHandler", op)
	case h.Source == nil:
		return fmt.Errorf("relaycore: RelayHandler.%s without a Source store", op)
	case target && h.Target == nil:
		return fmt.Errorf("relaycore: RelayHandler.%s without a Target store (a handler that only enqueues needs none; one that fires delivers to it)", op)
	}
	return nil
}

func (h *RelayHandler) hook() RelayHook {
	if h.Hook == nil {
		return noHook{}
	}
	return h.Hook
}

func (h *RelayHandler) clock() Clock {
	if h.Clock == nil {
		return SystemClock{}
	}
	return h.Clock
}

// claimTTL is the claim lifetime in effect (ClaimTTL or 30s).
func (h *RelayHandler) claimTTL() time.Duration {
	if h.ClaimTTL <= 0 {
		return 30 * time.Second
	}
	return h.ClaimTTL
}

// backoff is the delay before the next fire after idle consecutive fires
// without delivery.
func (h *RelayHandler) backoff(idle int) time.Duration {
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
