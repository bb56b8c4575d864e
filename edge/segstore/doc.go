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
// then may the receiver ACK. On Linux 5.8 and later (unless
// Options.FsyncEachFile) the file's fsync is one syncfs of the file
// system before the renames, shared by the group (group.go,
// fssync_linux.go); the order of the steps does not change. Write is Receive (temp file, hash on another
// goroutine, size and digest check) then Staged.Commit (fsync, then the
// rest); a pipelined receiver calls them separately so it reads the next
// segment while earlier ones commit, and reads a small segment with Stage
// and Staged.Fill instead: into the receive memory budget
// (Options.ReceiveMemory, one for the process, budget.go), waiting for
// room there, leaving the digest check and the pack record or temp file
// to Commit. While Receive writes a large segment
// it starts the writeback of every 8 MiB written (sync_file_range on
// Linux, writebehind.go), so the commit's fsync finds most of the file on
// disk already; a hint only, and writeback errors still surface in that
// fsync. The rename, directory fsync and index
// commit are group commits (group.go): every segment whose fsync finished
// while a group was committing joins the next group, which renames all of
// them, fsyncs the directory once and writes all entries in one bbolt
// transaction; the order of steps per segment, and what a crash between
// them leaves, are unchanged. Any failure removes whatever the attempt
// created (temp file or renamed file); the index entry is the commit
// point. Open's start-up scan finishes the job for a process that died
// mid-write: it removes temp files, removes segment files that have no
// index entry, and drops index entries whose file is missing. A file of
// the wrong size (torn or damaged) is quarantined with its entry dropped,
// and with Options.VerifyOnOpen so is one whose content no longer hashes
// to its entry's digest. The invariant, after Open and after every
// Write/Evict:
//
//	every index entry names a file in segments/ whose size is the entry's
//	size and whose content hashed to the entry's digest before it was
//	made durable and renamed into place; there is no temp file, and no file
//	named as a segment id without an index entry (a crash may leave
//	either, until the next Open removes it).
//
// So an acknowledged segment survives a crash, and a segment whose write
// did not finish leaves no trace after the next start. Files in segments/
// whose names are not valid segment ids are never touched (they are
// reported in the ScanReport).
//
// # Quarantine
//
// A damaged segment file is never deleted and never served: it is moved
// to <dir>/quarantine/<id>.<UTC time> (both directories fsynced) before
// its index entry is dropped, so a crash in between leaves an entry
// without a file (dropped at the next start), not a damaged file under
// its id. The quarantine does not count against the quota; the operator
// inspects and removes it. Open quarantines what its start-up check finds;
// while the store is used, every Reader verifies what it reads and
// quarantines a copy that no longer matches its entry the same way
// (verify.go). Either way the lost segment is recorded as wanted until it
// is stored again, so that the daemon can ask its peers for it.
//
// # Rebuild and digest tags
//
// When the database has no index bucket (a new database, after the
// daemon set a damaged one aside) Open does not take the segment files
// for orphans: it rebuilds the index from them, in one transaction with
// the bucket's creation, so a crash mid-rebuild leaves no index and the
// next start rebuilds again. The digest a rebuilt entry gets comes from
// the file's digest tag: the commit path sets an extended attribute
// (user.edged.segment: digest and source peer) on the temp file before
// writing, and the file is renamed into place only after its content
// matched that digest and was made durable with it. A file whose content
// matches its tag is what was acknowledged (Entry.Rebuilt =
// RebuiltFromTag); one that does not, or whose tag is garbled, is
// quarantined. A file without a tag (a file system without user extended
// attributes, or a file written before tags) is indexed under its
// content's own digest (RebuiltFromContent) and reported unverified:
// docs/edge.md explains what the relay's peers then decide. A rebuilt
// entry is not relayed: the relay ledger, lost with the database, is
// re-derived by the daemon.
//
// # Takedowns and tombstones
//
// Takedown evicts a segment for a takedown request and, in the
// transaction that removes its index entry, records a tombstone and the
// caller's receipt (and runs the caller's Seal, which cancels the ledger's
// records): a crash leaves the segment, or the tombstone and receipt with
// the content an orphan for the next Open to remove. A tombstoned id is
// refused by Reserve from then on (ErrEvicted), and a Reader open on it
// when it was taken down fails before its last bytes. See takedown.go.
//
// # Quota
//
// The quota bounds stored bytes, stored segment count and the size of one
// segment. Reserve holds space for a segment being received, and the
// quota check counts held reservations, so concurrent receivers cannot
// overshoot: Reserve, Write (which turns the reservation into stored
// space, or releases it on failure), Release. AllowSegment answers the
// same question without holding anything. When the store is full (the
// quota, or the disk refusing a write: ENOSPC is ErrQuota, with the
// attempt's files removed) Options.MakeRoom, if set, is asked to free
// space first (room.go); the Store itself never decides what to evict.
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
