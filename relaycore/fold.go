package relaycore

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Folded per-target figures (docs/layout.md, "Folded figures"). A
// transactional DynamoDB write bills every item at least 1 KB twice, so a
// t/<hex>/e record rewritten per target per enqueue batch and a t/<hex>/s
// record per target per fire cost most of a write unit per row when each
// target gets a few rows a batch. The enqueue batch rewrites os anyway and
// the fire checkpoint rs: the counters of a bounded number of targets ride
// in those instead, and the separate records are written only for targets
// beyond the bound and, for s, whenever anything but the delivery progress
// changes (state, holds, failures, notes), so an operator-visible change is
// always a full record.

// foldedEnq is one target's enqueue-side counters in os.Targets: a
// targetEnq with at most maxFoldRuns runs (its last run's last seq and
// commit time are targetEnq.Last and LastMS).
type foldedEnq struct {
	Hex     string     `json:"t"`
	N       uint64     `json:"n"`
	Runs    [][3]int64 `json:"r,omitempty"`
	Dropped bool       `json:"d,omitempty"`
}

// foldedDone is one target's delivery progress in rs.Targets: the fields of
// its t/<hex>/s record that a healthy target's deliveries change. When
// present they override the record's.
type foldedDone struct {
	Hex     string `json:"t"`
	Done    uint64 `json:"d,omitempty"`
	Through uint64 `json:"h,omitempty"`
	Next    uint64 `json:"x,omitempty"`
	NextMS  int64  `json:"xm,omitempty"`
}

// maxFolded bounds the targets folded into os and into rs; maxFoldRuns the
// runs a folded enqueue entry keeps (a t/<hex>/e record keeps maxEnqRuns).
const (
	maxFolded   = 32
	maxFoldRuns = 3
)

// Worst-case encoded sizes of one entry beside its hex name: every number
// at 20 digits, the keys, quotes, brackets and the comma after it.
const (
	foldedEnqOverhead  = 40 + maxFoldRuns*65 + 10
	foldedDoneOverhead = 30 + 4*26
)

// foldBytes is the room rs keeps for folded entries on a store with caps
// (worst-case sizes), and os twice that (its entries carry runs): 4 KB
// with batches of 1 MiB or more (DynamoDB's 4 MB, bbolt's), less in steps
// below, so a store with small batches folds fewer targets rather than
// giving pages much less room. Steps, not a fraction, so that batch limits
// near each other reserve the same.
func foldBytes(caps Capabilities) int {
	switch b := caps.MaxBatchBytes; {
	case b <= 0 || b >= 1<<20:
		return 4096
	case b >= 256<<10:
		return 2048
	case b >= 64<<10:
		return 1024
	}
	return 512
}

func osFoldBytes(caps Capabilities) int { return 2 * foldBytes(caps) }

func foldedEnqSize(hex string) int  { return len(hex) + foldedEnqOverhead }
func foldedDoneSize(hex string) int { return len(hex) + foldedDoneOverhead }

func (f foldedEnq) enq() targetEnq {
	e := targetEnq{N: f.N, Runs: f.Runs, Dropped: f.Dropped}
	if n := len(f.Runs); n > 0 {
		e.Last, e.LastMS = uint64(f.Runs[n-1][1]), f.Runs[n-1][2]
	}
	return e
}

func foldEnq(hex string, e targetEnq) foldedEnq {
	f := foldedEnq{Hex: hex, N: e.N, Runs: e.Runs, Dropped: e.Dropped}
	if len(f.Runs) > maxFoldRuns {
		f.Runs, f.Dropped = slices.Clone(f.Runs[len(f.Runs)-maxFoldRuns:]), true
	}
	return f
}

// folded finds hex's entry in entries, sorted by Hex.
func folded[T any](entries []T, hex string, key func(T) string) (int, bool) {
	return slices.BinarySearchFunc(entries, hex, func(e T, h string) int { return strings.Compare(key(e), h) })
}

func enqHex(f foldedEnq) string   { return f.Hex }
func doneHex(f foldedDone) string { return f.Hex }

// enqOf is t's enqueue-side counters in os, if folded there.
func (o OutboxState) enqOf(t Partition) (targetEnq, bool) {
	if i, ok := folded(o.Targets, targetHex(t), enqHex); ok {
		return o.Targets[i].enq(), true
	}
	return targetEnq{}, false
}

// withEnq returns os's entries with t's set to e, when t is folded already
// or there is room; ok false: t keeps a t/<hex>/e record.
func withEnq(entries []foldedEnq, t Partition, e targetEnq, caps Capabilities) ([]foldedEnq, bool) {
	h := targetHex(t)
	return upsertFolded(entries, foldEnq(h, e), enqHex, foldedEnqSize, osFoldBytes(caps))
}

// upsertFolded returns entries with v in its place by hex (key), replacing
// the entry of the same hex, or inserted when there is room: fewer than
// maxFolded entries whose sizes (size of each hex) stay within limit bytes.
// ok false: no room, and entries is returned unchanged. entries itself is
// never modified: it may be the decoded record's.
func upsertFolded[T any](entries []T, v T, key func(T) string, size func(string) int, limit int) ([]T, bool) {
	h := key(v)
	i, found := folded(entries, h, key)
	if found {
		out := slices.Clone(entries)
		out[i] = v
		return out, true
	}
	total := size(h)
	for _, f := range entries {
		total += size(key(f))
	}
	if len(entries) >= maxFolded || total > limit {
		return entries, false
	}
	return slices.Insert(slices.Clone(entries), i, v), true
}

// overlayDone applies t's folded delivery progress in rs to r, if any.
func (rs RelayState) overlayDone(r *targetRec) {
	if i, ok := folded(rs.Targets, targetHex(r.Target), doneHex); ok {
		d := rs.Targets[i]
		r.Done, r.Through, r.Next, r.NextMS = d.Done, d.Through, d.Next, d.NextMS
	}
}

// onlyProgress reports whether a and b differ at most in the fields rs
// folds.
func onlyProgress(a, b targetRec) bool {
	a.Done, a.Through, a.Next, a.NextMS = b.Done, b.Through, b.Next, b.NextMS
	return string(encodeTargetRec(a)) == string(encodeTargetRec(b))
}

// foldDone sets r's progress as t's entry in entries when t is folded
// already or there is room (ok); else it returns entries without t.
func foldDone(entries []foldedDone, r targetRec, caps Capabilities) ([]foldedDone, bool) {
	d := foldedDone{Hex: targetHex(r.Target), Done: r.Done, Through: r.Through, Next: r.Next, NextMS: r.NextMS}
	return upsertFolded(entries, d, doneHex, foldedDoneSize, foldBytes(caps))
}

// unfoldDone returns entries without t's.
func unfoldDone(entries []foldedDone, t Partition) []foldedDone {
	if i, ok := folded(entries, targetHex(t), doneHex); ok {
		return slices.Delete(slices.Clone(entries), i, i+1)
	}
	return entries
}

// hasDone reports whether rs folds t's progress.
func (rs RelayState) hasDone(t Partition) bool {
	_, ok := folded(rs.Targets, targetHex(t), doneHex)
	return ok
}

// folds are the records that fold per-target figures: os and rs.
type folds struct {
	os OutboxState
	rs RelayState
}

// readFolds reads os and rs for their folded figures.
func readFolds(ctx context.Context, st Store, source Partition) (folds, error) {
	var fs folds
	raw, found, err := st.Get(ctx, source, KeyOS)
	if err != nil {
		return fs, fmt.Errorf("read os %s: %w", source, err)
	}
	if fs.os, err = decodeOS(raw, found); err != nil {
		return fs, err
	}
	if raw, found, err = st.Get(ctx, source, KeyRS); err != nil {
		return fs, fmt.Errorf("read rs %s: %w", source, err)
	}
	if found {
		if fs.rs, err = decodeRS(raw); err != nil {
			return fs, err
		}
	}
	return fs, nil
}

// names lists the targets fs folds figures of, in hex order, each once.
func (fs folds) names() []string {
	var out []string
	for _, f := range fs.os.Targets {
		out = append(out, f.Hex)
	}
	for _, f := range fs.rs.Targets {
		out = append(out, f.Hex)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
