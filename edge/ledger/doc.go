// Package ledger is the edge agent's persistent relay ledger: one record
// per (segment_id, peer_id) saying where delivery of that segment to that
// peer stands. It is the only memory the relay has across restarts, so
// every change is a bbolt transaction and every transition is a
// compare-and-set on the record's current state.
//
// # States
//
//	Scheduled   waiting for a worker (insert-if-absent by the scheduler)
//	Inflight    claimed by one worker, which is sending it now
//	Acked       the peer acknowledged durable storage (terminal)
//	Failed      the last attempt failed; retry after NextAttemptAfter
//	Deadletter  retry budget exhausted or segment gone (terminal for
//	            automatic execution; an operator may retry or purge it)
//	Cancelled   delivery ended on purpose by a takedown (terminal): this
//	            node evicted the segment for one, or the peer refuses it
//	            because it did (NACK evicted). Not a failure: never
//	            retried, never deadlettered. Stored as Deadletter with a
//	            flag, so older agents read it as terminal too.
//
// # Transitions
//
//	EnsureScheduled        absent → Scheduled (any existing record is kept); EnsureScheduledAll: many
//	                       segments in one transaction; EnsureScheduledIn: in the caller's
//	                       write transaction (start-up reconciliation, with the relayed markers)
//	TryTransitionInflight  Scheduled → Inflight; Failed with NextAttemptAfter ≤ now → Inflight
//	TransitionAcked        Inflight → Acked
//	TransitionFailed       Inflight → Failed, or → Deadletter when the budget is spent
//	Postpone               Inflight → Failed, due at a given time, the attempt not charged to the budget
//	                       (the peer refused for want of room: NACK quota)
//	RetryDeadletter        Deadletter → Scheduled, with a fresh budget (operator)
//	Purge                  Deadletter → absent (operator)
//	Resend, ResendAll      Acked | Failed | Scheduled | Deadletter | absent → Scheduled, due now, with a
//	                       fresh budget (a peer lost its copy: its WANT, or an operator); Inflight is kept
//	InflightToFailed       Inflight → Failed | Deadletter (start-up: abandoned attempts)
//	PruneMissing           Scheduled | Inflight | Failed → Deadletter when the segment is gone
//	ReleaseDeferred        Scheduled | Failed deferred by Defer → same state, NextAttemptAfter back to what
//	                       it was before the deferral (start-up: the deferring circuit died with its process)
//	RescheduleReady        Failed with NextAttemptAfter ≤ now → Scheduled
//	RemoveSettled          Acked | Cancelled → absent, for every record of a segment no longer stored whose
//	                       records are all Acked or Cancelled and older than the retention (see RemoveSettled)
//	Defer                  Scheduled | Failed → same state, NextAttemptAfter moved later, no attempt counted
//	                       (the relay's dial circuit: a peer known to be unreachable)
//	Cancel                 Inflight → Cancelled (the peer answered NACK evicted)
//	CancelSegmentIn        Scheduled | Inflight | Failed | Deadletter → Cancelled, every record of a segment,
//	                       inside the takedown's eviction transaction
//
// Any other (state, operation) pair is refused with a *TransitionError
// (errors.Is(err, ErrIllegalTransition)); an operation on an absent record
// fails with ErrNotFound. Bulk operations (the recovery functions, and the
// wildcard forms of RetryDeadletter and Purge) act only on the records
// they apply to and leave the others untouched.
//
// # Attempts and the retry budget
//
// Attempts counts attempts started (TryTransitionInflight increments it)
// and never decreases, so an attempt abandoned by a crash still counts:
// a segment that crashes the agent cannot loop forever. BudgetBase is the
// value Attempts had when the current retry budget began (0 at creation;
// RetryDeadletter sets it to Attempts; Postpone moves it up by one, so an
// attempt the peer refused for want of room is not charged). A failure with
// Attempts − BudgetBase ≥ Policy.MaxRetries deadletters the record;
// otherwise the record waits Policy.Backoff(Attempts − BudgetBase). So
// an operator retry grants exactly MaxRetries more attempts while the
// history of how many were made survives.
//
// # Determinism
//
// No operation reads the clock or a random source: callers pass now. The
// pending scan returns records in (NextAttemptAfter, SegmentID, PeerID)
// order from an index bucket whose keys sort that way, so two agents with
// the same ledger and the same now pick the same work. Back-off has no
// jitter. TestNoPRNGInRelayPath enforces the absence of PRNG imports.
//
// # Storage
//
// The ledger lives in one top-level bucket, "edge.ledger", of a *bolt.DB
// the caller opens, with two sub-buckets: "records" (key segment_id 0x00
// peer_id, value JSON) and "pending" (key 8-byte big-endian
// NextAttemptAfter ‖ segment_id 0x00 peer_id, empty value), holding
// exactly the Scheduled and Failed records. The database is meant to be
// shared with the segment store (edge/segstore) so that eviction can check
// the ledger and delete the index entry in one transaction (EvictionGate);
// the ledger never touches other buckets.
//
// Segment and peer ids must be non-empty, at most MaxIDLen bytes, and free
// of NUL bytes (the key separator).
package ledger
