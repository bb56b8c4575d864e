package relaycore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Loose deletes (docs/layout.md, "Loose deletes").
//
// On a store that is a LooseDeleter a fire checkpoint does not delete the
// outbox pages it finished: it lists them in rs.gone, in the same batch that
// records their rows as delivered, and the fire deletes them after the batch
// landed, one by one, at half the price of a delete inside the batch on
// DynamoDB. A page listed in rs.gone is gone as far as the engine is
// concerned: its rows are counted delivered, and no batch writes its key
// again (page keys are seqs, never reused). Until it is deleted for real it
// is a ghost, and whoever reads pages must not take it for a live one:
//
//   - a fire or an operator action deletes the ghosts of rs.gone when it
//     takes the claim, before it reads any page, and clears the list in the
//     claim's rs write (a fire of the same alarm knows its predecessor's
//     were deleted and skips that);
//   - Alarm deletes them before it looks for pages left, and its clear of
//     the alarm record writes rs without the list;
//   - InspectSource leaves them out. SourceRelayState does not read rs (it
//     answers from one scan of the partition's head): a ghost there makes
//     its answer early (an older first row, not empty), which is still a
//     lower bound, for as long as the ghost lasts.
//
// A crash between the checkpoint and the deletes leaves ghosts that the next
// claimer deletes. Deleting a ghost is safe at any time, by anyone.

// goneEntryBytes bounds one rs.gone entry: a seq as JSON (at most 20
// digits) and its comma. A gone_held entry takes its length and 3 (quotes
// and comma).
const goneEntryBytes = 21

// goneOverhead is `,"gone":[]` and `,"gone_held":[]`.
const goneOverhead = 25

// goneBytes is the room rs keeps for its two lists of ghosts, as many
// bytes as the folded progress entries get in os (osFoldBytes), plus
// their names: a checkpoint lists pages while the room lasts.
func goneBytes(caps Capabilities) int { return goneOverhead + osFoldBytes(caps) }

// heldGoneCost is the room a held page's gone_held entry takes.
func heldGoneCost(key string) int { return len(key) - len(layout.HeldPrefix) + 3 }

// looseDeleter is the source store as a LooseDeleter, nil when it is not one.
func (h *RelayHandler) looseDeleter() LooseDeleter {
	ld, _ := h.Source.(LooseDeleter)
	return ld
}

// pageSeq is the seq a page key names (its original first seq).
func pageSeq(key string) (uint64, error) {
	hex, ok := strings.CutPrefix(key, layout.PagePrefix)
	if !ok || len(hex) != 16 {
		return 0, fmt.Errorf("%w: %q is not a page key", ErrCorruptRecord, key)
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a page key", ErrCorruptRecord, key)
	}
	return n, nil
}

// ghostKeys is the keys of the pages rs lists as gone: outbox pages
// (gone) and held pages (gone_held).
func ghostKeys(rs RelayState) []string {
	keys := make([]string, 0, len(rs.Gone)+len(rs.GoneHeld))
	for _, s := range rs.Gone {
		keys = append(keys, layout.PageKey(s))
	}
	for _, k := range rs.GoneHeld {
		keys = append(keys, layout.HeldPrefix+k)
	}
	return keys
}

// isGone reports whether outbox page key is listed in gone (ascending).
func isGone(gone []uint64, key string) bool {
	if len(gone) == 0 {
		return false
	}
	s, err := pageSeq(key)
	if err != nil {
		return false
	}
	_, found := slices.BinarySearch(gone, s)
	return found
}

// isHeldGone reports whether held page key is listed in goneHeld
// (ascending).
func isHeldGone(goneHeld []string, key string) bool {
	k, ok := strings.CutPrefix(key, layout.HeldPrefix)
	if !ok || len(goneHeld) == 0 {
		return false
	}
	_, found := slices.BinarySearch(goneHeld, k)
	return found
}

// deleteGhosts deletes the ghosts (keys) that are still there: one read of
// them all, then a loose delete of those present (a ghost already deleted
// costs a read, not a write). On a store that is not a LooseDeleter (rs
// written by a process on another store wrapper) each is deleted in a batch
// of its own.
func (h *RelayHandler) deleteGhosts(ctx context.Context, source Partition, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	present, err := GetMany(ctx, h.Source, source, keys)
	if err != nil {
		return fmt.Errorf("read delivered pages: %w", err)
	}
	var del []string
	for _, k := range keys {
		if _, ok := present[k]; ok {
			del = append(del, k)
		}
	}
	return h.deletePages(ctx, source, del)
}

// deletePages deletes delivered pages outside any batch.
func (h *RelayHandler) deletePages(ctx context.Context, source Partition, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if ld := h.looseDeleter(); ld != nil {
		if err := ld.DeleteLoose(ctx, source, keys); err != nil {
			return fmt.Errorf("delete delivered pages: %w", err)
		}
		return nil
	}
	for _, k := range keys {
		if err := h.Source.Apply(ctx, source, Batch{Writes: []Write{{Key: k, Delete: true}}}); err != nil {
			return fmt.Errorf("delete delivered page %s: %w", k, err)
		}
	}
	return nil
}

// rsGhostsDeleted returns the ghosts rs (raw, as read) lists after making
// sure they are deleted: by this alarm (memo) or now.
func (h *RelayHandler) rsGhostsDeleted(ctx context.Context, source Partition, raw []byte, found bool, memo *goneMemo) ([]string, error) {
	if !found {
		return nil, nil
	}
	rs, err := decodeRS(raw)
	if err != nil {
		return nil, err
	}
	keys := ghostKeys(rs)
	if !memo.done(keys) {
		if err := h.deleteGhosts(ctx, source, keys); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// rsWithoutGone is the write of rs (raw) with its gone list cleared.
func rsWithoutGone(raw []byte) (Write, error) {
	rs, err := decodeRS(raw)
	if err != nil {
		return Write{}, err
	}
	rs.Version++
	rs.Gone, rs.GoneHeld = nil, nil
	return Write{Key: KeyRS, Value: encodeJSON(rs)}, nil
}

// goneMemo carries, across the fires of one alarm, the ghosts (keys) this
// alarm has deleted, so the next fire, which keeps the claim without
// writing rs, does not read them again.
type goneMemo struct {
	deleted []string
}

func (m *goneMemo) done(keys []string) bool {
	return m != nil && len(keys) > 0 && slices.Equal(m.deleted, keys)
}
