package relaycore

import (
	"context"
	"time"
)

// EnqueueOptions are the per-call arguments of RelayHandler.Enqueue; what
// is the same for every call (stores, clock, kicker, logger, tuning) is
// the handler's. The zero value enqueues without a lease, deadline or
// idempotency key.
type EnqueueOptions struct {
	// Lease is the caller's lease on the source: required for a
	// lease-required source (ErrLeaseRequired without it), nil otherwise.
	// The commit fails closed with ErrStaleLease once it is no longer the
	// source's lease.
	Lease *Lease
	// Deadline is the last moment a batch may be sent (zero: none; with a
	// Lease, also the lease expiry minus the handler's SkewMargin). Rows
	// not committed by then fail with ErrDeadlineExceeded and seq 0.
	Deadline time.Time
	// IdempotencyKey, when set (1..128 bytes of [A-Za-z0-9._:-]), makes
	// the call idempotent per source: the rows commit in one batch with a
	// record under the key, and a later call with the same key and rows
	// while the record lives (the handler's IdempotencyTTL) commits nothing
	// and returns the first call's seqs (CommitResult.Replayed). The same
	// key with other rows fails with ErrIdempotencyKeyReused. This is what
	// makes a client's retry after a lost response safe. Empty: off.
	IdempotencyKey string
}

// Enqueue validates rows and commits them to source's outbox in h.Source,
// in order per (source, target), each target's rows with contiguous seqs;
// it then kicks h.Kicker once (best effort: the durable alarm the commit
// wrote still holds, and a kick failure goes to h.Logger). Rows that could
// never be delivered to h.Target (its capabilities; nil Target: those of
// Source) fail before anything is written, with a *RowError naming the row;
// a source id that breaks SourceIDProblem's rule fails with
// ErrInvalidSourceID. Enqueue needs only Source: a producer's handler may
// leave Target nil (Alarm and Fire then refuse to run).
//
// Enqueue commits a chain of store batches when the rows need several.
// After an os race (another writer committed first) it re-plans only the
// uncommitted rows; an ambiguous store error is resolved by re-reading the
// outbox, so no seq is reused or lost. On error, CommitResult.Seqs still
// reports the rows that committed (non-zero seq); with ErrCommitUnknown the
// rows of the batch in flight may or may not be in the outbox (a retry
// with the same IdempotencyKey commits them at most once).
func (h *RelayHandler) Enqueue(ctx context.Context, source Partition, rows []Row, opts EnqueueOptions) (CommitResult, error) {
	if err := h.needStores("Enqueue", false); err != nil {
		return CommitResult{Seqs: make([]uint64, len(rows))}, err
	}
	cfg := h.enqueueConfig()
	cfg.IdempotencyKey = opts.IdempotencyKey
	return commitRelayRows(ctx, h.Source, h.clock(), source, opts.Lease, opts.Deadline, rows, cfg)
}

// Requeue enqueues archive entry id of source again, as Requeue does, with
// the handler's stores, clock, kicker and logger.
func (h *RelayHandler) Requeue(ctx context.Context, source Partition, id uint64) ([]uint64, error) {
	if err := h.needStores("Requeue", false); err != nil {
		return nil, err
	}
	return Requeue(ctx, h.Source, h.clock(), source, id, h.enqueueConfig())
}

// enqueueConfig is the EnqueueConfig the handler's fields make: the one
// place its kicker, logger and target capabilities reach an enqueue.
func (h *RelayHandler) enqueueConfig() EnqueueConfig {
	cfg := EnqueueConfig{
		SkewMargin:     h.SkewMargin,
		PageBytes:      h.PageBytes,
		Kicker:         h.Kicker,
		Logger:         h.Logger,
		MaxReplans:     h.MaxReplans,
		IdempotencyTTL: h.IdempotencyTTL,
	}
	if h.Target != nil {
		cfg.TargetCaps = h.Target.Capabilities()
	}
	return cfg
}
