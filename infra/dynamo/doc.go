// Package dynamo implements the relaycore storage contract on Amazon
// DynamoDB with aws-sdk-go-v2.
//
// # Mapping
//
// One table holds every partition. A relaycore.Partition is the partition
// key `p` (S), a key is the sort key `k` (S) and a value is the attribute
// `v` (B). An empty value is stored without `v`, because DynamoDB-API
// emulators disagree about empty binaries and the absence costs nothing to
// read back. docs/dynamodb.md is the authoritative description of the
// layout; users read target tables and operators read source tables, so it
// is a contract.
//
//   - Get is a strongly consistent GetItem.
//   - Scan is a strongly consistent Query whose key condition expresses the
//     whole range, including the page cursor (see Store.Scan for why the
//     cursor is not an ExclusiveStartKey).
//   - Apply of a batch on several keys is exactly one TransactWriteItems. A
//     precondition on a key that the batch also writes becomes that Put's
//     or Delete's ConditionExpression; a precondition on any other key
//     becomes a ConditionCheck. CancellationReasons are mapped back to the
//     index of a failed precondition.
//   - Apply of a batch on one key (SingleItem) is one PutItem or DeleteItem
//     with the same ConditionExpression, billed half a transactional write,
//     or, with preconditions only, one strongly consistent GetItem checked
//     here. A ConditionalCheckFailedException is mapped back to the index
//     of the failed precondition.
//   - DeleteLoose (relaycore.LooseDeleter) is BatchWriteItem
//     DeleteRequests, 25 keys a request, billed half a transactional
//     delete.
//   - Due is served by a sparse global secondary index (see DueMode).
//
// # Errors and retries
//
// The store owns all retrying (the SDK's own retryer is switched off per
// call) so that back-off is bounded, configurable and deterministic under
// test. Throttling and transaction conflicts are retried; if retries run
// out the batch was surely not applied. A lost response, a timeout after
// sending or a 5xx leaves the outcome unknown: Apply retries a transaction
// with the SAME ClientRequestToken, which DynamoDB treats as idempotent for
// ten minutes (a repeat of a committed request succeeds without writing
// again), and reports relaycore.ErrMaybeApplied if the ambiguity is not
// resolved. PutItem and DeleteItem have no token, so their retry runs
// again: a guarded write that landed then fails its own condition. Once an
// attempt was ambiguous, a later condition failure is therefore reported
// as ErrMaybeApplied, never as a *relaycore.ConditionFailedError: the
// failed condition may be the first attempt's own write. (An unguarded
// single write retried after an ambiguous attempt may land twice; every
// engine batch is guarded.) Reads and loose deletes change nothing a
// repeat could break, so every transient failure of them is retried.
//
// # Capacity
//
// minidyn returns no ConsumedCapacity, so Store.Stats
// counts requests and computes read and write units from DynamoDB's
// published formulas for the requests this store sends. The formulas and
// their sources are in docs/dynamodb.md.
package dynamo
