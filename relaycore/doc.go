// Package relaycore is the relay engine: source-side, at-least-once outbox
// delivery to target partitions, ordered per (source, target), made
// idempotent by target watermarks — including after a crash before source
// cleanup. It declares the storage contract it consumes (Store, in
// store.go), the alarm kick (Kicker) and the Clock, and imports no AWS,
// bbolt or network package; adapters live in infra/.
//
// # Vocabulary
//
//   - outbox: the undelivered rows of one source, kept in the source's
//     partition as row pages.
//   - source: a partition that produces rows (one outbox). Each source has
//     its own os, rs, optional lease and alarm.
//   - target: a partition that receives rows; it may be in another store
//     (RelayHandler.Source and .Target are separate).
//   - row: puts and deletes (disjoint keys) for one target, applied
//     atomically there. A key that is ever relay-deleted must have exactly
//     one producing source; distinct sources may upsert a key only with
//     identical values.
//   - sequence (seq): a row's position in its source's outbox, from 1,
//     assigned at commit, never reused or skipped. Delivery is ordered by
//     seq per (source, target); nothing is promised across targets.
//   - page: the stored unit of the outbox: rows of ONE target with
//     contiguous seqs, from one enqueue batch, in a compact binary encoding
//     (shared key prefixes, the row section DEFLATE-compressed when that
//     shortens it; docs/layout.md), filled close below PageBytes.
//   - os (outbox state): next seq, a version bumped by every write, the last
//     commit time and the lease-required flag. Every enqueue batch guards it
//     and puts its successor (compare-and-set), so enqueuers serialize.
//   - rs (relay state): the source's scan cycle: cycle_end, cursor, blocked
//     set, idle count and the fire claim.
//   - rh (relay high-water mark): per (target, source), the last seq applied
//     at the target, stored in the target partition under
//     "_relay/rh/<source>". Every target batch guards rh and advances it with
//     the row writes, so rows at or below rh are never applied twice. rh
//     records never expire.
//   - cycle: one pass over the outbox from the head to cycle_end, the last
//     committed seq when the cycle started. Rows appended during a cycle wait
//     for the next one.
//   - cycle_end: see cycle. cursor == cycle_end is the completed marker; the
//     next fire starts a new cycle from the head with an empty blocked set.
//   - cursor: the last seq the cycle has inspected. Invariant: during an
//     active cycle every undelivered row with seq <= cursor has its target in
//     the blocked set. Hence no later row for a target is applied while an
//     older one is undelivered.
//   - blocked set: sorted targets (at most MaxBlockedTargets) whose delivery
//     failed this cycle; fires skip their rows. Only delivery failures
//     (including hook errors) block; reaching the target budget only pauses
//     the cursor before the next target. Blocked targets are retried at
//     each cycle start. A target that fails while the set is full is held
//     instead (below); the cycle goes on.
//   - target record: per (source, target), kept in the source partition by
//     the engine: t/<hex>/e (rows enqueued, written by enqueue batches) and
//     t/<hex>/s (state, rows done, held rows, consecutive failures, last
//     error, operator note; written by fires and operator actions).
//     TargetStatus, ListTargets and GetTarget read them; nothing scans the
//     outbox to answer.
//   - held rows: a target's rows moved out of the outbox scan into held
//     pages (u/<hex>/<seq>), oldest first: always older than the target's
//     rows still in the outbox, so delivering them first keeps seq order.
//     A target holds when it is quarantined or paused, or has held rows.
//   - quarantine: a target that failed QuarantineAfter rounds in a row (or
//     an operator said so) holds its rows, existing and new, and costs
//     fires nothing until released. Pause is the same on purpose
//     (maintenance), without counting failures.
//   - retry marker: v/<due>/<hex>, the schedule of an active target's held
//     rows (a retry after it failed with the blocked set full, or a redrive
//     after Release/Resume). Fires serve due markers first, with at most
//     half of their targets.
//   - dead-row archive: w/<first seq>, rows an operator skipped (Skip),
//     removed from the outbox without being applied, with who, why and the
//     last error; listable and requeueable (Requeue).
//   - hold summary: q, totals over the target records (held rows,
//     quarantined and paused targets) and lower bounds of the held rows'
//     seqs and commit times, for the one-scan queries.
//   - fire: one bounded unit of delivery work for one source (Fire): claim
//     the source (claim.go), take held rows that are due (redrive.go), scan
//     from the cursor (scan.go), deliver to up to TargetsPerFire targets
//     (deliver.go), then one guarded checkpoint that advances rs, deletes
//     the delivered rows, moves aside the rows of targets that hold and
//     updates the target records (checkpoint.go). Duplicate and overlapping
//     fires are safe: the claim makes them step aside, and every write is
//     guarded. Operator actions (operator.go) take the same claim.
//   - alarm: the source's durable wake-up record (due time), written in the
//     same batch as the rows it wakes for, so a committed row can never
//     lose its wake-up; plus a best-effort fast-path Kick, and a sweeper for
//     overdue alarms. One alarm runs up to FiresPerAlarm fires (Alarm).
//   - budget: RelayBudget, the work per fire and fires per alarm (Free and
//     Paid plans). A fire inspects at most 4×RowsPerFire rows.
//   - watermark: RelayWatermark, a commit-time lower bound of the undelivered
//     outbox; TargetWatermark is a target's rh. ReadTarget pages through a
//     target partition's application keys and TargetWatermarks lists
//     every source's rh there (target_read.go).
//   - hook: a RelayHook adds writes to each target batch, atomically with
//     the rows and the rh advance (none by default; HolderRelayHook,
//     TakedownRequestTimer).
//   - takedown handoff: TakedownRequestTimer turns each ContentTakedownV1
//     request a row carries into a durable record holding the request and
//     a timer for the future takedown owner; it never acknowledges one.
//   - idempotency key: EnqueueOptions.IdempotencyKey makes one enqueue
//     commit at most once: its rows and an x/idem/<key> record (digest of
//     the rows, their seqs, expiry) land in one batch, and a retry with the
//     same key and rows returns the stored seqs (CommitResult.Replayed)
//     instead of committing again. Alarms collect expired records.
//   - lease: an optional single-writer lease on a source. Enqueue batches of
//     a holder guard the lease record, so a stale holder fails closed.
//     Sources declared lease-required refuse enqueue without one.
//
// # Caveats
//
// Delivery is at least once at the level of target batches and exactly once
// in effect: a row's writes are applied in the batch that advances rh past
// it, and never again. Hooks must tolerate being asked again for the same
// rows. A mid-cycle append waits for the next cycle, which can exceed
// RelayLagBoundMS; consumers of RelayWatermark must tolerate that lag.
// docs/engine.md explains a fire step by step; docs/layout.md every key.
package relaycore
