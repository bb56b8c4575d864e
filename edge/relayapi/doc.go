// Package relayapi is edged's client of the relay's takedown API
// (docs/takedown.md, "The node and the relay"): it tells the relay which
// segments this node holds, pulls the takedown orders addressed to it and
// posts the signed receipts of its evictions. Three jobs, each a loop of
// passes run by Agent.Run:
//
//   - The holdings reporter compares the segment index with what the
//     relay was last told (the bucket edge.holdings: id → digest and size
//     of every segment reported held) and reports the difference, in id
//     order, in batches of at most relay_api.batch reports: POST
//     /v1/holdings, every relay_api.report_interval and within
//     relay_api.report_delay of a store or a takedown (Agent.Stored,
//     Agent.Changed: passes started so begin at least report_delay apart,
//     so a burst of stores is one batch). A segment indexed and not reported, or reported with
//     another digest, is reported held; one reported and no longer
//     indexed (evicted on relay, to make room, quarantined, taken down) is
//     reported evicted, with the digest it had. A batch is written to the
//     database, with its idempotency key, before it is sent, and the
//     holdings bucket is updated only when the relay answered 200, in one
//     transaction that also drops the batch. So a retry after a lost
//     answer repeats the key and the body byte for byte (the relay answers
//     replayed and writes nothing), a restart resends the batch it finds,
//     and a node offline for a week reports exactly what changed meanwhile
//     when it is back. A database rebuilt at start (edged's self-repair)
//     has an empty holdings bucket and a new key epoch, so it reports
//     everything it holds again under keys no earlier batch used.
//   - The order puller reads GET /v1/orders after its cursor (in the
//     bucket edge.relayapi) and applies each order with the daemon's
//     Takedown (one transaction: the index entry, the ledger records, the
//     tombstone and the signed receipt). The cursor moves past an order
//     only once it was handled durably: evicted or taken down before (the
//     receipt is stored), or refused for good (a segment this node neither
//     holds nor took down: logged and counted, nothing signed). A segment
//     being written or a node certificate that cannot sign leaves the
//     cursor where it is and the order is asked again.
//   - The receipt poster posts every stored receipt the relay has not
//     accepted (the bucket edge.receipts.posted records the relay's
//     verdict): POST /v1/receipts. Receipts are stored in the takedown's
//     own transaction, so a crash (kill -9) between the eviction and the
//     post leaves a receipt that the next start posts. A 5xx answer or a
//     network error is retried with back-off; a 4xx answer (422
//     receipt_refused above all) is recorded as the relay's verdict,
//     logged and counted, and not retried.
//
// Failed requests are retried after min(relay_api.backoff.max,
// relay_api.backoff.initial·2^(n-1)), each wait scaled by a factor in
// (0.75, 1] fixed per node id (spread): thousands of nodes that lost the
// relay at the same moment do not come back in step, and a node's waits
// stay deterministic. A pass that succeeded waits its interval, scaled the
// same way.
//
// Authentication: the node's own mutual-TLS certificate (tls.cert,
// tls.key, re-read like the peers' connections) towards relay serve, or
// AWS SigV4 (service lambda, the default credential chain) towards a
// Lambda function URL. Either way the relay derives the node from the
// credential, never from what the request says.
package relayapi
