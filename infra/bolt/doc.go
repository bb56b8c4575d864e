// Package bolt implements the relaycore storage contract on bbolt
// (go.etcd.io/bbolt), the embedded default: one file, one process, no
// server, crash-safe commits.
//
// # Files, tables, partitions
//
// A DB is one bbolt file. DB.Store(table) returns the contract for one
// table, so a relay's source table and target table can share a file (or
// live in two files: the engine cannot tell). Inside the file:
//
//	<table>/part/<partition>/<key> = value       the items
//	<table>/due/<due><len(p)><p><key> = ""       the due index, oldest first
//	<table>/dueof/<len(p)><p><key> = <due>       reverse entry, to move or drop an item's due entry
//
// where <due> is the due time as 8 big-endian bytes with the sign bit
// flipped, so byte order is numeric order, and <len(p)> is one byte
// (partition names are at most relaycore.MaxPartitionLen = 255 bytes).
// A partition bucket is dropped when its last key is deleted, so an
// emptied partition leaves nothing behind.
//
// # Batches
//
// Apply is one bbolt read-write transaction (db.Update): preconditions are
// read, then writes and due-index updates are made, then bbolt commits. The
// transaction is the atomicity; bbolt's single writer is the isolation, so
// a precondition read in the transaction still holds at commit. Applys on
// one file that arrive while another commits share the next transaction
// (group commit: one fsync for all of them), each applied in arrival
// order with its own outcome: a false precondition fails that batch alone,
// writing nothing; any other failure inside the transaction retries every
// batch of the group alone. A lone Apply never waits for company.
// Capabilities default to DynamoDB's limits so that plans proven on the
// embedded store also fit DynamoDB; Options.Capabilities raises them for
// deployments that only ever run embedded.
//
// # Which failures are "surely not applied"
//
// bbolt commits by writing the new pages, syncing, then writing and syncing
// one meta page; the meta page is the commit point. A failure before the
// commit callback finishes (a false precondition, a closed DB, a cancelled
// context) rolls back with nothing written: surely not applied. A failure
// inside Commit is reported with relaycore.ErrMaybeApplied unless it is
// bbolt's ErrMaxSizeReached, because bbolt returns the raw I/O error and
// does not say whether the meta page was written: after a failed write or
// fsync of the meta page the commit may already be visible (the page cache
// holds it) and may or may not survive a crash. ErrMaxSizeReached can only
// come from growing the file, which happens before any page is written, so
// it is surely not applied and the store stays usable. Other growth
// failures (a full disk) are also pre-commit in fact, but bbolt flattens
// them into strings, so they are reported as maybe-applied: a re-read
// settles them, which is what the engine does with any ambiguous outcome.
// DB.CommitErr keeps the latest failed commit's error until a commit
// succeeds, so a server can report the file as not ready while it is full.
//
// # Caveats
//
// bbolt allows one writer at a time, so concurrent Applys serialise (group
// commit only saves their fsyncs); group writes into batches. Context cancellation is checked before and at the
// start of the transaction, not while waiting for bbolt's writer lock.
// Written keys are limited to MaxKeyLen bytes (bbolt's key limit minus the
// due-index prefix); DynamoDB's sort key limit (1024 bytes) is far lower,
// so the bolt limit never binds a key that DynamoDB accepts.
package bolt
