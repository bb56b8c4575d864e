// Package relay is the edge agent's outbound side: the scheduler that
// keeps a ledger record for every stored segment and every peer that
// should receive it, the worker pool that executes those records
// (executeRelay), the success-condition check that marks a segment relayed
// and, with evict_on_relay, evicts it, and the start-up reconciliation
// that repairs the ledger after a stop or crash.
//
// # Who must receive a segment
//
// The required peers of a segment are the configured known_peers minus
// the peer the segment came from (segstore.Entry.Source): relaying a
// segment back to its sender is wasted bandwidth, since the sender already
// holds it. A segment ingested locally (Source "") is owed to every known
// peer. The success condition (one_peer, all_peers) is evaluated over the
// required peers only, so on a node whose only peer is the sender the
// condition is never met and the segment is never evicted: that node is a
// destination, not a forwarder.
//
// # Execution
//
// Workers (relay.workers of them) claim work one at a time, under one
// mutex, in ledger pending order (NextAttemptAfter, SegmentID, PeerID):
// the claim is the ledger's compare-and-set TryTransitionInflight, so the
// order in which records are claimed is a function of the ledger alone.
// A claimed attempt opens the segment, takes a pooled connection to the
// peer or dials one (mutual TLS), sends OFFER and SEGMENT and waits up to
// relay.ack_timeout for the reply. Only a matching ACK is success
// (TransitionAcked); a NACK, a mismatched or missing or late ACK, or any
// local or network error is a failed attempt (TransitionFailed, which
// applies back-off or deadletters at max_retries), except a refusal for
// want of room (NACK quota), which is postponed without spending the
// retry budget and paces the peer's room circuit (full.go).
//
// # Dial circuit
//
// A dial that fails (connect, TLS handshake or HELLO) opens the peer's
// dial circuit for relay.backoff's wait (Policy.Backoff of the number of
// consecutive failed rounds: bounded exponential, no jitter). While it is
// open, records for that peer that come due are deferred to the time it
// half-opens (ledger.Defer: no attempt counted, no dial), and the claim
// scan goes on to other peers' work. Once half-open, the next due record
// is the probe, an ordinary attempt; its dial closes the circuit or opens
// it again for longer. Without this, each due record of a silent peer cost
// a worker a whole dial_timeout, starving the reachable peers. See
// circuit.go.
//
// Connections are reused for later exchanges with the same peer. A peer
// may have closed an idle connection meanwhile; an attempt whose pooled
// connection turns out to be dead (EOF, reset, broken pipe before any
// reply) is repeated once on a fresh connection, within the same attempt.
// Resending is safe: a receiver acknowledges a segment it already holds.
//
// # Success and eviction
//
// After every terminal transition (Acked, Deadletter), and whenever a
// segment is stored (Schedule: a copy received again after its eviction
// finds every record already Acked), checkSuccessCondition evaluates the
// segment's assurance. When the condition is met it sets the
// index's relayed marker (durably, before anything else) and logs
// "relay success" with the condition and ack count. With evict_on_relay
// it then evicts the segment through segstore.EvictIf with the ledger's
// EvictionGate, which re-checks, in the transaction that deletes the index
// entry, that the condition holds and no required peer's delivery is still
// pending or in flight. Eviction therefore never precedes the durable
// success condition; a blocked eviction is retried at the next terminal
// transition of the segment and at start-up.
//
// # Retention
//
// With Config.Retention (relay.ledger_retention) the records of a segment
// that is no longer stored are removed once all are Acked for that long
// (PruneSettled, at Reconcile and periodically in Run). The window is the
// memory that keeps a copy coming back from being relayed again; see
// docs/edge.md for why records are not removed at eviction time.
//
// # Determinism
//
// There is no random source in this package (enforced by edge/ledger's
// TestNoPRNGInRelayPath). Back-off has no jitter; the only inputs are the
// ledger, the configuration and the clock.
package relay
