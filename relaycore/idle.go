package relaycore

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Idle targets' collection (docs/layout.md, "Idle collection"): without
// it a source keeps the figures of every target it ever relayed to, so
// its storage grows with every target ever used rather than with the
// targets in use.

// defaultIdleTargetTTL is RelayHandler.IdleTargetTTL's default: a week
// without activity, well past the day ListTargets keeps a recovered
// target's last error on show.
const defaultIdleTargetTTL = 7 * 24 * time.Hour

// idleSweepRecords bounds the t/ records one sweep reads (the folded
// targets come on top).
const idleSweepRecords = 512

func (h *RelayHandler) idleTTL() time.Duration {
	switch {
	case h.IdleTargetTTL < 0:
		return 0
	case h.IdleTargetTTL == 0:
		return defaultIdleTargetTTL
	}
	return h.IdleTargetTTL
}

// lastActivity is the latest time anything happened to a target: rows
// committed for it, a change of state, a failure, an operator action. Its
// rows' delivery follows their commit and is not timed: the figures say
// nothing is pending, so a target whose rows waited long is collected the
// sooner after they went, and nothing is lost (its rh stays).
func lastActivity(e targetEnq, r targetRec) int64 {
	at := max(e.LastMS, r.SinceMS)
	if r.LastError != nil {
		at = max(at, r.LastError.AtMS)
	}
	if r.Note != nil {
		at = max(at, r.Note.AtMS)
	}
	return at
}

// idle reports whether a target's figures may be collected at nowMS: nothing
// pending or held, active, no failure run, not redriving, and no activity
// for ttlMS.
func idle(e targetEnq, r targetRec, blocked []Partition, nowMS, ttlMS int64) bool {
	return e.N == r.Done && r.Held == 0 && r.State == StateActive && r.FailedRounds == 0 && r.FailedAttempts == 0 &&
		!r.Released && r.RetryMS == 0 && !slices.Contains(blocked, r.Target) && nowMS-lastActivity(e, r) >= ttlMS
}

// collectIdle runs one sweep of source's targets, at most every eighth of
// the TTL: the idle ones lose their os and rs entries and their t/<hex>/e
// and t/<hex>/s records, in one batch guarded on os and rs as read. An
// enqueue committing meanwhile changes os, a fire or an operator action
// claims rs, so either makes the batch fail and the next sweep looks
// again; an enqueue after it starts the target from zero on both sides.
// It returns how many targets it collected.
//
// last is the alarm's last fire: when its checkpoint landed it says when
// the last sweep was, so an alarm between sweeps reads nothing.
func (h *RelayHandler) collectIdle(ctx context.Context, source Partition, last FireResult) (int, error) {
	ttl := h.idleTTL()
	if ttl <= 0 {
		return 0, nil
	}
	now := unixMS(h.clock().Now())
	every := max(ttl.Milliseconds()/8, 1)
	if last.sweepKnown && now-last.sweptMS < every {
		return 0, nil
	}
	rsRaw, rsFound, err := h.Source.Get(ctx, source, KeyRS)
	if err != nil || !rsFound {
		return 0, err
	}
	rs, err := decodeRS(rsRaw)
	if err != nil {
		return 0, err
	}
	if rs.Claim != nil && rs.Claim.UntilMS > now {
		return 0, nil // a fire or an action is at work; the next alarm looks
	}
	if now-rs.SweptMS < every {
		return 0, nil
	}
	osRaw, osFound, err := h.Source.Get(ctx, source, KeyOS)
	if err != nil || !osFound {
		return 0, err
	}
	os, err := decodeOS(osRaw, osFound)
	if err != nil {
		return 0, err
	}
	fs := folds{os: os, rs: rs}
	sts, cursor, err := h.sweepStatuses(ctx, source, fs, rs.SweepAfter)
	if err != nil {
		return 0, err
	}
	caps := h.Source.Capabilities()
	room := 1 << 30
	if caps.MaxBatchItems > 0 {
		room = caps.MaxBatchItems - 2 // os and rs
	}
	next, nextOS := rs, os
	next.Version++
	next.Claim, next.SweptMS, next.SweepAfter = nil, now, cursor
	var writes []Write
	collected := 0
	for _, st := range sts {
		if !idle(st.e, st.r, rs.Blocked, now, ttl.Milliseconds()) || len(st.keys) > room {
			continue
		}
		room -= len(st.keys)
		for _, k := range st.keys {
			writes = append(writes, Write{Key: k, Delete: true})
		}
		next.Targets = unfoldDone(next.Targets, st.r.Target)
		nextOS.Targets = unfoldEnq(nextOS.Targets, st.r.Target)
		collected++
	}
	pre := []Precondition{{Key: KeyRS, Value: rsRaw}}
	writes = append([]Write{{Key: KeyRS, Value: encodeJSON(next)}}, writes...)
	if collected > 0 {
		// os is rewritten (a new version) whenever targets go, even when
		// none of them was folded into it: an enqueue that read a deleted
		// t/<hex>/e record before this batch guards the os it read, and
		// must fail rather than write the record back with its old count
		// (rs, which the fires guard, changes anyway).
		nextOS.Version++
		writes = append(writes, Write{Key: KeyOS, Value: encodeJSON(nextOS)})
	}
	pre = append(pre, Precondition{Key: KeyOS, Value: osRaw})
	err = h.Source.Apply(ctx, source, Batch{Preconditions: pre, Writes: writes})
	if _, lost := FailedPrecondition(err); lost {
		return 0, nil // raced by an enqueue, a fire or an action: the next sweep looks again
	}
	if err != nil {
		return 0, fmt.Errorf("collect idle targets %s: %w", source, err)
	}
	return collected, nil
}

// sweptTarget is one target a sweep judged: its figures and the keys of
// its records.
type sweptTarget struct {
	e    targetEnq
	r    targetRec
	keys []string
}

// sweepStatuses reads the t/ records after cursor (at most
// idleSweepRecords, whole targets) and those of every folded target, and
// returns the targets' figures and the cursor for the next sweep ("" once
// the range is done).
func (h *RelayHandler) sweepStatuses(ctx context.Context, source Partition, fs folds, cursor string) ([]sweptTarget, string, error) {
	pg, err := h.Source.Scan(ctx, source, ScanRequest{Start: layout.TargetPrefix, End: layout.TargetEnd, After: cursor, Limit: idleSweepRecords})
	if err != nil {
		return nil, "", err
	}
	items, next := pg.Items, ""
	if pg.Next != "" && len(items) > 2 {
		// Whole targets only (two records at most each): the last one may
		// go on past the page, so the next sweep starts with it.
		last, _, _ := cutTargetKey(items[len(items)-1].Key)
		for {
			if th, _, _ := cutTargetKey(items[len(items)-1].Key); th != last {
				break
			}
			items = items[:len(items)-1]
		}
		th, _, _ := cutTargetKey(items[len(items)-1].Key)
		next = layout.TargetPrefix + th + "/~"
	}
	byHex := map[string]*sweptTarget{}
	var order []string
	get := func(th string) *sweptTarget {
		if st, ok := byHex[th]; ok {
			return st
		}
		name, _ := hex.DecodeString(th)
		st := &sweptTarget{r: targetRec{Target: Partition(name), State: StateActive}}
		byHex[th] = st
		order = append(order, th)
		return st
	}
	add := func(it Item) error {
		th, kind, ok := cutTargetKey(it.Key)
		if _, err := hex.DecodeString(th); !ok || err != nil {
			return fmt.Errorf("%w: target record key %q", ErrCorruptRecord, it.Key)
		}
		st := get(th)
		st.keys = append(st.keys, it.Key)
		var err error
		switch kind {
		case "e":
			st.e, err = decodeTargetEnq(it.Value, true)
		case "s":
			st.r, err = decodeTargetRec(st.r.Target, it.Value, true)
		default:
			err = fmt.Errorf("%w: target record key %q", ErrCorruptRecord, it.Key)
		}
		return err
	}
	for _, it := range items {
		if err := add(it); err != nil {
			return nil, "", err
		}
	}
	// Folded targets outside the page: read their records.
	var keys []string
	for _, th := range fs.names() {
		if _, ok := byHex[th]; !ok {
			get(th)
			keys = append(keys, layout.TargetPrefix+th+"/e", layout.TargetPrefix+th+"/s")
		}
	}
	if len(keys) > 0 {
		vals, err := GetMany(ctx, h.Source, source, keys)
		if err != nil {
			return nil, "", err
		}
		for _, k := range keys {
			if v, ok := vals[k]; ok {
				if err := add(Item{Key: k, Value: v}); err != nil {
					return nil, "", err
				}
			}
		}
	}
	slices.Sort(order)
	out := make([]sweptTarget, 0, len(order))
	for _, th := range order {
		st := byHex[th]
		if e, ok := fs.os.enqOf(st.r.Target); ok {
			st.e = e
		}
		fs.rs.overlayDone(&st.r)
		out = append(out, *st)
	}
	return out, next, nil
}

// unfoldEnq returns entries without t's.
func unfoldEnq(entries []foldedEnq, t Partition) []foldedEnq {
	if i, ok := folded(entries, targetHex(t), enqHex); ok {
		return slices.Delete(slices.Clone(entries), i, i+1)
	}
	return entries
}
