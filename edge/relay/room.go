package relay

import (
	"cmp"
	"errors"
	"slices"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// Evicted is one segment MakeRoom evicted.
type Evicted struct {
	ID   string
	Size int64
}

// MakeRoom frees space for storage.on_full: evict_relayed_oldest. It
// evicts relayed segments, oldest received first (ties by id), until at
// least bytes and segments have been freed or no candidate is left, and
// returns what it evicted. A candidate is evicted only through the same
// ledger gate as evict_on_relay (ledger.EvictionGate, checked in the
// transaction that deletes the index entry): its success condition holds
// and no required peer's delivery is pending or in flight. So a segment
// that is still owed to anyone is never evicted, whatever the pressure;
// a segment with no required peers is never relayed and never a
// candidate. The relayed marker is only the pre-filter.
//
// Concurrent calls (two receives short of room at once) may each evict;
// each frees what its own reservation lacks, and a candidate evicted by
// the other call is skipped.
func (e *Executor) MakeRoom(bytes, segments int64) []Evicted {
	entries, err := e.store.List()
	if err != nil {
		e.log.Error("storage full: listing segments failed", "err", err)
		return nil
	}
	var cands []segstore.Entry
	for _, en := range entries {
		if en.Relayed {
			cands = append(cands, en)
		}
	}
	slices.SortFunc(cands, func(a, b segstore.Entry) int {
		return cmp.Or(a.Received.Compare(b.Received), cmp.Compare(a.ID, b.ID))
	})
	var out []Evicted
	var freedBytes, freedSegs int64
	for _, en := range cands {
		if freedBytes >= bytes && freedSegs >= segments {
			break
		}
		err := e.store.EvictIf(en.ID, e.led.EvictionGate(en.ID, e.RequiredPeers(en), e.cfg.Condition))
		switch {
		case err == nil:
			out = append(out, Evicted{ID: en.ID, Size: en.Size})
			freedBytes += en.Size
			freedSegs++
		case errors.Is(err, ledger.ErrEvictionBlocked), errors.Is(err, segstore.ErrNotFound), errors.Is(err, segstore.ErrBusy):
			// Still owed, or someone else is evicting it.
		default:
			e.log.Error("storage full: eviction failed", "segment", en.ID, "err", err)
		}
	}
	return out
}
