package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// The engine keeps room for the largest rs in every fire checkpoint and
// bounds pages by the room beside it. With the sim's ordinary rows (pages
// of a few hundred bytes against batch limits of 24 KB and more) no
// checkpoint ever comes near that bound, so a fire that stopped keeping the
// room would go unnoticed. Bulk scenarios make such checkpoints common.

// RSMaxBytes is the engine's bound on an encoded rs (a full blocked set of
// longest names, each base64-encoded, plus the scalar fields; rsMaxBytes in
// relaycore/fire.go), which every fire checkpoint keeps room for. The
// engine does not export it; relaycore's TestSimRSMaxBytes keeps this copy
// equal to it, because the checkpoint-room invariant is checked with it.
const RSMaxBytes = 512 + (relaycore.MaxBlockedTargets+1)*(len(`"\u0000",`)+(relaycore.MaxPartitionLen*4+2)/3) +
	len(`,"sweep_after":"t//~"`) + 2*relaycore.MaxPartitionLen

// rsReserve is what a fire checkpoint keeps beside the pages it may
// rewrite, as source items of caps: rs (RSMaxBytes) and the rest of the
// engine's checkpoint reserve (q, a target record, retry markers, the keys
// of a page moved aside), which relaycore.CheckpointReserve includes.
func rsReserve(caps relaycore.Capabilities, source relaycore.Partition) int {
	return max(caps.ItemSize(source, relaycore.KeyRS, RSMaxBytes), relaycore.CheckpointReserve(source, caps))
}

// sizing is the item accounting bulk scenarios are sized with: the
// largest overhead of the stores the sim runs on, and a batch limit in the
// step of the engine's room for folded figures in rs and os that bulk
// source batches (the reserve and 12 or 16 KB, under 64 KB) fall in.
var sizing = relaycore.Capabilities{ItemOverhead: maxItemOverhead, MaxBatchBytes: 32 << 10}

// maxItemOverhead bounds the stores' Capabilities.ItemOverhead (mem and
// bolt 32, DynamoDB 23), so bulk rows sized with it fit every store.
const maxItemOverhead = 32

// pageRoom is the largest page (as a source item) the engine plans for s:
// the item limit, and the room beside rs in a checkpoint.
func pageRoom(s relaycore.Partition, l Limits) int {
	return min(l.MaxItemBytes, l.MaxBatchBytes-rsReserve(sizing, s))
}

// bulk turns sc into a bulk scenario: source batches that hold only a few
// pages beside rs, pages of large incompressible values, target batches
// of one or two rows and one call per target and fire (so fires deliver
// pages in part), several targets per fire. Writers keep their plans' timing; their rows
// are replaced. Every draw comes from rb.
func (sc *Scenario) bulk(rb *rand.Rand) {
	room := pick(rb, 12<<10, 16<<10)
	sc.SourceLimits = Limits{
		MaxBatchItems: pick(rb, 8, 25, 100),
		MaxBatchBytes: rsReserve(sizing, "s0") + room, // source names are s0..s3: same length
		MaxItemBytes:  pick(rb, 8<<10, 16<<10),
	}
	// Pages of a half or a third of the room, so a checkpoint holds a few.
	sc.PageBytes = room / pick(rb, 2, 3)
	// Target batches of a row or two and one call per target and fire:
	// pages are delivered in part.
	sc.TargetLimits = Limits{MaxBatchItems: pick(rb, 4, 6, 100), MaxBatchBytes: pick(rb, 1536, 2<<10)}
	sc.TargetLimits.MaxItemBytes = min(sc.TargetLimits.MaxBatchBytes, pick(rb, 1<<10, 2<<10))
	sc.Budget.TargetsPerFire = pick(rb, 3, 4, 6, 8)
	sc.Budget.CallsPerTarget = 1
	sc.Budget.RowsPerFire = pick(rb, 32, 64, 128)

	// Many owned keys per target, so successive rows rarely write the same
	// key: a target batch coalesces rows of one key into one write, which
	// would let it take a whole page.
	for _, t := range sc.Targets {
		for i := range 24 {
			sc.keys[t] = append(sc.keys[t], keySpec{Key: fmt.Sprintf("b%02d", i), Owner: sc.Sources[rb.IntN(len(sc.Sources))]})
		}
	}

	value := 0
	for _, wp := range sc.writers {
		for i := range wp.batches {
			targets := sc.writableTargets(wp.source)
			if len(targets) == 0 {
				continue // keep the ordinary rows
			}
			var rows []relaycore.Row
			// Several targets per batch, several rows each: one page per
			// target, so a fire meets pages of different targets in turn.
			rb.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
			targets = targets[:min(len(targets), 2+rb.IntN(4))]
			for _, t := range targets {
				for range 2 + rb.IntN(7) {
					rows = append(rows, sc.bulkRow(rb, wp.source, t, &value))
				}
			}
			wp.batches[i].rows = rows
		}
	}
}

// writableTargets are the targets with a key that source s may write.
func (sc *Scenario) writableTargets(s relaycore.Partition) []relaycore.Partition {
	var out []relaycore.Partition
	for _, t := range sc.Targets {
		for _, k := range sc.keys[t] {
			if k.Owner == "" || k.Owner == s {
				out = append(out, t)
				break
			}
		}
	}
	return out
}

// bulkRow is one row of s for t: one or two of t's keys that s may write;
// owned keys get a unique incompressible value (mostly large) or a delete,
// shared keys their fixed value.
func (sc *Scenario) bulkRow(rb *rand.Rand, s, t relaycore.Partition, value *int) relaycore.Row {
	var mine []keySpec
	for _, k := range sc.keys[t] {
		if k.Owner == "" || k.Owner == s {
			mine = append(mine, k)
		}
	}
	rb.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
	row := relaycore.Row{Target: t}
	var owned []string
	for _, k := range mine[:1+rb.IntN(min(2, len(mine)))] {
		switch {
		case k.Owner == "":
			row.Puts = append(row.Puts, relaycore.KV{Key: k.Key, Value: sharedValue(t, k.Key)})
		case rb.IntN(6) == 0:
			row.Deletes = append(row.Deletes, k.Key)
		default:
			owned = append(owned, k.Key)
		}
	}
	// A long-named target's shared values and deletes can leave no room
	// for more keys: keep the first.
	for len(owned) > 0 && len(row.Puts)+len(row.Deletes) > 0 && sc.bulkValueMax(s, row, len(owned)) < 32 {
		owned = owned[1:]
	}
	for len(row.Puts)+len(row.Deletes) > 1 && sc.bulkValueMax(s, row, 1) < 0 {
		if len(row.Deletes) > 0 {
			row.Deletes = row.Deletes[1:]
		} else {
			row.Puts = row.Puts[1:]
		}
	}
	if len(owned) == 0 {
		return row
	}
	// Values of up to half a target batch: a target batch takes one or two
	// rows, a page holds several, so fires deliver pages in part.
	most := min(sc.bulkValueMax(s, row, len(owned)), sc.TargetLimits.MaxBatchBytes/2)
	for _, k := range owned {
		*value++
		v := fmt.Appendf(nil, "%s.%d.", s, *value) // unique, so a replayed effect shows
		var size int
		if rb.IntN(3) == 0 {
			size = rb.IntN(most + 1)
		} else {
			size = most/2 + rb.IntN(most/2+1)
		}
		for len(v) < size {
			v = append(v, byte(rb.Uint32()))
		}
		row.Puts = append(row.Puts, relaycore.KV{Key: k, Value: v})
	}
	return row
}

// bulkValueMax is the largest value each of n more puts (n >= 1; negative:
// row is already too large) may have beside row (its shared puts and
// deletes so far) so that the row fits one target
// item and one target batch beside rh and the hook's write (a row that
// fits only without the hook write would block its target for good), and
// a source page beside rs. Keys are at most 2 bytes ("k0".."k6"); the
// margins cover varints and the page header.
func (sc *Scenario) bulkValueMax(s relaycore.Partition, row relaycore.Row, n int) int {
	const keyLen, over = 3, maxItemOverhead
	t := row.Target
	tl := sc.TargetLimits
	item := len(t) + keyLen + over                                          // one put's target item, without its value
	used := len(t) + len(relaycore.RHKey(s)) + 20 + over                    // rh
	used += len(t) + len(hookPrefix+"obs") + len("holder-") + len(t) + over // the hook's write
	page := len(s) + len(layout.PageKey(0)) + over + 64 + len(t)            // page item and header
	for _, kv := range row.Puts {
		used += item + len(kv.Value)
		page += keyLen + 16 + len(kv.Value)
	}
	for range row.Deletes {
		used += item
		page += keyLen + 16
	}
	byItem := tl.MaxItemBytes - item
	byBatch := (tl.MaxBatchBytes-used)/n - item
	byPage := (pageRoom(s, sc.SourceLimits)-page)/n - (keyLen + 16)
	return min(byItem, byBatch, byPage) - 16
}
