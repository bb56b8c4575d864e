// Package takedowns is the relay's takedown owner (issue 23): the holder
// index (which node holds which content, with its digest and the time of
// its last report), takedown requests resolved into one
// relaycore.ContentTakedownV1 per holder, the owner that turns each
// request's handoff into an order in the holder's order partition, the
// checks a signed eviction receipt must pass before it counts, and the
// status that says who still holds the content. docs/takedown.md explains
// the design; lambda/api serves it over HTTP.
//
// Everything the package keeps lives in target partitions under Namespace
// and gets there as ordinary relay rows (relaycore.RelayHandler.Enqueue):
// the engine's ordering per (source, target), its watermarks and its
// idempotency keys are what make reports ordered and orders exactly once in
// effect, on every store the engine runs on. The package uses only
// relaycore's public API and edge/takedown (the receipt format); it imports
// no AWS, bbolt or PostgreSQL code.
//
// Sources (each the single producer of the keys it writes):
//   - HoldingsSource(node): node's holder reports, in the order it sent them.
//   - ControlSource: everything else (requests, orders, receipts, waivers).
//
// Targets:
//   - HoldersTarget(content): one of HolderShards shards of the holder index;
//     key "<content>/<node>" is the node's last report and
//     "<content>/<node>/at" the relay's time and seq of it (written by Hook).
//   - TakedownTarget(id): one takedown: "meta", its requests
//     (relaycore.TakedownPrefix), their handoffs (TakedownRequestTimer, run
//     by Hook), "ordered/<request>", "receipt/<request>",
//     "waive/<node>/<key>" (one per waiver).
//   - OrdersTarget(node): node's orders: "r/<request>" as the owner wrote it
//     and "o/<seq>" (Hook: the same order under its source seq, the
//     ascending cursor GET /v1/orders pages by).
//   - OpenTarget: the takedowns the owner watches, by id.
package takedowns
