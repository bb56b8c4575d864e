package relaycore

import (
	"bytes"
	"context"
	"fmt"
)

type claimedRS struct {
	RelayState
	newCycle bool
}

// claimed is what a fire (or an operator action) starts from: rs as
// claimed and exactly as written, os and the hold summary q.
type claimed struct {
	rs    claimedRS
	rsRaw []byte
	os    OutboxState
	q     holdSummary
}

// readOSHold reads os and q with one scan: they are adjacent keys.
func readOSHold(ctx context.Context, st Store, source Partition) (OutboxState, holdSummary, error) {
	head, err := scanRange(ctx, st, source, KeyOS, KeyHold+"\x00")
	if err != nil {
		return OutboxState{}, holdSummary{}, fmt.Errorf("read os %s: %w", source, err)
	}
	osRaw, osFound := head[KeyOS]
	os, err := decodeOS(osRaw, osFound)
	if err != nil {
		return OutboxState{}, holdSummary{}, err
	}
	qRaw, qFound := head[KeyHold]
	q, err := decodeHold(qRaw, qFound)
	return os, q, err
}

// claim reads rs, os and q and takes the source's fire claim, starting a
// new cycle when rs is absent or completed (unless keepCycle: an operator
// action claims without touching the cycle). busy reports another live
// claim.
func (h *RelayHandler) claim(ctx context.Context, source Partition, token string, now int64, keepCycle bool) (claimed, bool, error) {
	for attempt := 0; attempt < 4; attempt++ {
		raw, found, err := h.Source.Get(ctx, source, KeyRS)
		if err != nil {
			return claimed{}, false, fmt.Errorf("claim %s: read rs: %w", source, err)
		}
		var rs RelayState
		if found {
			if rs, err = decodeRS(raw); err != nil {
				return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
			}
		}
		if c := rs.Claim; c != nil && c.Owner != token && c.UntilMS > now {
			return claimed{}, true, nil
		}
		os, q, err := readOSHold(ctx, h.Source, source)
		if err != nil {
			return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
		}
		newCycle := !keepCycle && (!found || rs.Completed())
		if !newCycle && rs.Claim != nil && rs.Claim.Owner == token {
			return claimed{rs: claimedRS{RelayState: rs}, rsRaw: raw, os: os, q: q}, false, nil // kept from our previous fire
		}
		next := rs
		next.Version++
		if newCycle {
			next.CycleEnd, next.Cursor, next.From, next.Blocked = os.NextSeq-1, 0, "", nil
		}
		next.Claim = &Claim{Owner: token, UntilMS: now + h.claimTTL().Milliseconds()}
		nextRaw := encodeJSON(next)
		pre := Precondition{Key: KeyRS, Absent: true}
		if found {
			pre = Precondition{Key: KeyRS, Value: raw}
		}
		err = h.Source.Apply(ctx, source, Batch{Preconditions: []Precondition{pre}, Writes: []Write{{Key: KeyRS, Value: nextRaw}}})
		if err == nil {
			return claimed{rs: claimedRS{RelayState: next, newCycle: newCycle}, rsRaw: nextRaw, os: os, q: q}, false, nil
		}
		if _, ok := FailedPrecondition(err); ok || MayBeApplied(err) {
			if MayBeApplied(err) {
				if cur, ok, rerr := h.Source.Get(ctx, source, KeyRS); rerr == nil && ok && bytes.Equal(cur, nextRaw) {
					return claimed{rs: claimedRS{RelayState: next, newCycle: newCycle}, rsRaw: nextRaw, os: os, q: q}, false, nil
				}
			}
			continue
		}
		return claimed{}, false, fmt.Errorf("claim %s: %w", source, err)
	}
	return claimed{}, true, nil
}
