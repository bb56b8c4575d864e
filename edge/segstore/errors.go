package segstore

import "errors"

// ErrNotFound means no segment with that id is stored.
var ErrNotFound = errors.New("segment not found")

// ErrAlreadyHave means the segment is already stored with the same size
// and digest. It is not a failure: a receiver acknowledges it again
// (the wire protocol's idempotent re-ACK). Nothing was written.
var ErrAlreadyHave = errors.New("segment already stored")

// ErrEvicted means the segment was taken down here (Store.Takedown): its
// tombstone refuses it for good, whoever offers it. Nothing was written.
// (NACK evicted; bad_request to a peer older than wire version 4.) A
// Reader opened before the takedown returns it instead of the segment's
// last bytes.
var ErrEvicted = errors.New("segment evicted for a takedown")

// ErrDigestConflict means a segment with that id is stored with a
// different digest or size. Nothing was written. (NACK bad_request.)
var ErrDigestConflict = errors.New("segment id already stored with a different digest")

// ErrInvalid means a malformed id, digest or size. Nothing was written.
// (NACK bad_request.)
var ErrInvalid = errors.New("invalid segment offer")

// ErrTooLarge means the size exceeds the maximum segment size. Nothing
// was written. (NACK too_large.)
var ErrTooLarge = errors.New("segment exceeds max segment size")

// ErrQuota means storing the segment would exceed the byte or segment
// quota, counting space reserved by receivers in progress. Nothing was
// written. (NACK quota.)
var ErrQuota = errors.New("storage quota exceeded")

// ErrSourceShare means the source (the peer offering the segment) holds
// Options.SourceReserveBytes or SourceReserveSegments in reservations
// already: its unfinished segments may not take more of the quota, so
// they cannot keep other peers out. It is not ErrQuota: MakeRoom is not
// asked to evict anything for it. Nothing was written; retrying once the
// source's segments finished is safe. (NACK quota.)
var ErrSourceShare = errors.New("source's share of the quota for unfinished segments is taken")

// ErrBusy means the id is being written or evicted by another goroutine
// right now. Nothing was written; retrying later is safe. (NACK internal.)
var ErrBusy = errors.New("segment busy")

// ErrChecksum means the received content's SHA-256 differs from the
// offer. Nothing was kept. (NACK checksum.)
var ErrChecksum = errors.New("segment checksum mismatch")

// ErrSize means the stream held fewer or more bytes than the offered size.
// Nothing was kept. (NACK bad_request.)
var ErrSize = errors.New("segment size mismatch")

// ErrReservationUsed means Write was called on a reservation that was
// already written or released.
var ErrReservationUsed = errors.New("reservation already used or released")

// ErrDamaged means a stored segment's content no longer matches its index
// entry (bit rot, a bad card, a file changed behind the store's back),
// found while it was read: a Reader returns it instead of the last bytes
// of the segment, so no caller sends a whole damaged copy, and the store
// has quarantined the copy (see Reader).
var ErrDamaged = errors.New("stored segment damaged")
