// Package segstore keeps content segments on local disk, with a bbolt
// index and a quota, for the edge agent.
//
// # Layout
//
// Segment files live in <dir>/segments/, one file per segment named by its
// id. Open creates the directory if needed and fsyncs the parent of each
// directory it creates (CreateDir), so the layout survives a crash right
// after the first start. The index is the bucket "edge.segments" of a *bolt.DB the caller
// opens (normally <dir>/edged.db, shared with edge/ledger so that
// EvictIf can consult the relay ledger in the transaction that removes
// the index entry). Index values are JSON: size, sha256, received time,
// source peer, relayed marker.
//
// # Commit path and the crash-safety invariant
//
// Write streams into a temp file (<dir>/segments/.tmp-<id>-*), hashing as
// it goes, and then, in this order: checks the size and SHA-256 against
// the offer, fsyncs the file, renames it to its id, fsyncs the directory,
// and commits the index entry. Only then does Write return nil, and only
// then may the receiver ACK. Any failure removes whatever the attempt
// created (temp file or renamed file); the index entry is the commit
// point. Open's start-up scan finishes the job for a process that died
// mid-write: it removes temp files, removes segment files that have no
// index entry, and drops index entries whose file is missing or has the
// wrong size. The invariant, after Open and after every Write/Evict:
//
//	every index entry names a file in segments/ whose size is the entry's
//	size and whose content hashed to the entry's digest before it was
//	renamed into place and fsynced; there is no temp file, and no file
//	named as a segment id without an index entry (a crash may leave
//	either, until the next Open removes it).
//
// So an acknowledged segment survives a crash, and a segment whose write
// did not finish leaves no trace after the next start. Files in segments/
// whose names are not valid segment ids are never touched (they are
// reported in the ScanReport).
//
// # Quota
//
// The quota bounds stored bytes, stored segment count and the size of one
// segment. Reserve holds space for a segment being received, and the
// quota check counts held reservations, so concurrent receivers cannot
// overshoot: Reserve, Write (which turns the reservation into stored
// space, or releases it on failure), Release. AllowSegment answers the
// same question without holding anything.
//
// # Ids and digests
//
// A segment id is 1–128 bytes of letters, digits, '.', '-', '_' and does
// not start with '.' or '-': it is a file name, ids arrive from the
// network, and every stored segment must be one OFFER can carry (the rule
// is wire.CheckSegmentID's).
// A digest is the SHA-256 of the content as 64 hex digits (stored lower
// case).
//
// # Concurrency and lock order
//
// A Store is safe for concurrent use. One id is written or evicted by at
// most one goroutine at a time (others get ErrBusy). Store.mu may be held
// while a bbolt read transaction runs; it is never taken inside a bbolt
// transaction, and EvictIf's gate must not call back into the Store.
package segstore
