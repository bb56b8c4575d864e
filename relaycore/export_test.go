package relaycore

import (
	"context"
	"time"
)

// Internals the external tests size their fixtures with, so a boundary test
// sits exactly where the engine draws the line.
const (
	// RSMaxBytes is the bound on an encoded rs a fire checkpoint keeps room
	// for beside the pages it may rewrite.
	RSMaxBytes = rsMaxBytes
	// TargetRecMaxBytes and HoldMaxBytes bound a target record and q, which
	// a checkpoint also keeps room for (one record per target it selects).
	TargetRecMaxBytes = targetRecMaxBytes
	HoldMaxBytes      = holdMaxBytes
)

// TargetStateKey is the key of target's delivery-state record.
func TargetStateKey(t Partition) string { return targetStateKey(t) }

// PageRewriteBound is the largest encoding of any suffix of p's rows: what
// a fire reserves in its checkpoint for a page it may rewrite.
func PageRewriteBound(p Page) int { return pageRewriteBound(p) }

// Engine internals that relaycore's own tests call by their former
// exported names: the page and takedown codecs, the key and cost
// functions, the row key bound.
const MaxKeyLen = maxKeyLen

// RSBound is rs's largest encoding on a store with caps, folded progress
// included.
func RSBound(caps Capabilities) int { return rsBound(caps) }

var (
	DecodePage         = decodePage
	EncodeTakedown     = encodeTakedown
	TakedownKey        = takedownKey
	TakedownHandoffKey = takedownHandoffKey
	TransactWriteUnits = transactWriteUnits
)

// NoHook is the hook of a handler whose Hook is nil.
type NoHook = noHook

// ClaimTTLOrDefault is the claim lifetime in effect (ClaimTTL or 30s).
func (h *RelayHandler) ClaimTTLOrDefault() time.Duration { return h.claimTTL() }

// SweepIdle runs one idle-target sweep of source, as an alarm does after
// its fires.
func (h *RelayHandler) SweepIdle(ctx context.Context, source Partition) (int, error) {
	return h.collectIdle(ctx, source, FireResult{})
}
