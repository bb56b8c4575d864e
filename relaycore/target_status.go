package relaycore

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// TargetStatus is one (source, target)'s delivery state, from the engine's
// records (t/<hex>/e and t/<hex>/s); nothing here scans the outbox.
type TargetStatus struct {
	Target Partition `json:"target"`
	// TargetHex is the name's bytes in lowercase hex when they are not
	// valid UTF-8: JSON shows such a name with U+FFFD in place of the
	// bytes, so this is the exact name (TargetNameHex).
	TargetHex string      `json:"target_hex,omitempty"`
	State     TargetState `json:"state"`
	SinceMS   int64       `json:"since_ms,omitempty"`
	// Pending counts rows enqueued for the target and not yet delivered
	// (in the outbox or held); Held the ones held aside.
	Pending uint64 `json:"pending"`
	Held    uint64 `json:"held"`
	// FirstSeq is the first undelivered seq and OldestMS its commit time
	// (0 when nothing is pending). Exact is false when they come from the
	// enqueue log after older entries were dropped: then FirstSeq and
	// OldestMS are upper bounds of the truth, and the target's fires refine
	// them as they reach its rows.
	FirstSeq uint64 `json:"first_seq,omitempty"`
	OldestMS int64  `json:"oldest_ms,omitempty"`
	Exact    bool   `json:"exact"`
	// Enqueued counts rows ever enqueued for the target, Done the ones that
	// left the outbox (delivered, or skipped into the archive).
	Enqueued uint64 `json:"enqueued"`
	Done     uint64 `json:"done"`
	Skipped  uint64 `json:"skipped,omitempty"`
	// DeliveredThrough is the target's rh as the engine last saw it.
	DeliveredThrough uint64 `json:"delivered_through,omitempty"`
	// HeldFirst and HeldLast bound the held seqs (0 when none).
	HeldFirst uint64 `json:"held_first,omitempty"`
	HeldLast  uint64 `json:"held_last,omitempty"`
	// FailedAttempts and FailedRounds count consecutive failures (reset by
	// a delivery); LastError is the latest failure, kept after recovery.
	FailedAttempts int        `json:"failed_attempts"`
	FailedRounds   int        `json:"failed_rounds"`
	LastError      *LastError `json:"last_error,omitempty"`
	// RetryMS: when held rows are next tried (0: not scheduled).
	RetryMS int64 `json:"retry_ms,omitempty"`
	// Released: redriving after an operator release; a failure sends it
	// back to quarantine.
	Released bool          `json:"released,omitempty"`
	Note     *OperatorNote `json:"note,omitempty"`
}

func statusOf(t Partition, e targetEnq, s targetRec) TargetStatus {
	st := TargetStatus{Target: t, TargetHex: TargetNameHex(t), State: s.State, SinceMS: s.SinceMS, Held: s.Held, Enqueued: e.N, Done: s.Done,
		Skipped: s.Skipped, DeliveredThrough: s.Through, HeldFirst: s.HeldFirst, HeldLast: s.HeldLast,
		FailedAttempts: s.FailedAttempts, FailedRounds: s.FailedRounds, LastError: s.LastError, RetryMS: s.RetryMS,
		Released: s.Released, Note: s.Note, Exact: true}
	if e.N > s.Done {
		st.Pending = e.N - s.Done
	}
	if st.Pending == 0 {
		return st
	}
	switch {
	case s.Held > 0: // held rows are older than anything left in the outbox
		st.FirstSeq, st.OldestMS = s.HeldFirst, s.HeldMS
	case s.Next > s.Through:
		st.FirstSeq, st.OldestMS = s.Next, s.NextMS
	default:
		for i, run := range e.Runs {
			first, last := uint64(run[0]), uint64(run[1])
			if last <= s.Through {
				continue
			}
			st.FirstSeq, st.OldestMS = max(first, s.Through+1), run[2]
			st.Exact = !(i == 0 && e.Dropped && first > s.Through+1)
			break
		}
	}
	return st
}

// targetStatuses groups t/ items (e then s per target, in key order) and
// the virtual items of folded targets (foldItems), with fs's figures over
// the records'.
func targetStatuses(items []Item, fs folds) ([]TargetStatus, error) {
	return (*SourceInspector)(nil).targetStatuses(items, fs)
}

// foldedKind is the kind of a virtual item that stands for a target whose
// figures os or rs fold: it sorts between e and s, and has no value.
const foldedKind = "f"

// foldItems are the virtual items of fs's folded targets with keys above
// after, in key order.
func foldItems(fs folds, after string) []Item {
	var out []Item
	for _, h := range fs.names() {
		if k := layout.TargetPrefix + h + "/" + foldedKind; k > after {
			out = append(out, Item{Key: k})
		}
	}
	return out
}

// mergeItems merges b into a, both in key order.
func mergeItems(a, b []Item) []Item {
	out := append(slices.Clone(a), b...)
	slices.SortStableFunc(out, func(x, y Item) int { return strings.Compare(x.Key, y.Key) })
	return out
}

// targetStatuses decodes the records through in (nil: decode them all).
func (in *SourceInspector) targetStatuses(items []Item, fs folds) ([]TargetStatus, error) {
	var out []TargetStatus
	for i := 0; i < len(items); {
		th, _, ok := cutTargetKey(items[i].Key)
		if !ok {
			return nil, fmt.Errorf("%w: target record key %q", ErrCorruptRecord, items[i].Key)
		}
		name, err := hex.DecodeString(th)
		if err != nil {
			return nil, fmt.Errorf("%w: target record key %q", ErrCorruptRecord, items[i].Key)
		}
		t := Partition(name)
		var eItem, sItem Item
		var eFound, sFound bool
		for ; i < len(items); i++ {
			h, kind, ok := cutTargetKey(items[i].Key)
			if !ok || h != th {
				break
			}
			switch kind {
			case "e":
				eItem, eFound = items[i], true
			case "s":
				sItem, sFound = items[i], true
			case foldedKind:
			default:
				return nil, fmt.Errorf("%w: target record key %q", ErrCorruptRecord, items[i].Key)
			}
		}
		var e targetEnq
		if eFound {
			if e, err = memo(in, eItem, func(b []byte) (targetEnq, error) { return decodeTargetEnq(b, true) }); err != nil {
				return nil, err
			}
		}
		if fe, ok := fs.os.enqOf(t); ok {
			e = fe
		}
		s, err := decodeTargetRec(t, nil, false)
		if sFound {
			s, err = memo(in, sItem, func(b []byte) (targetRec, error) { return decodeTargetRec(t, b, true) })
		}
		if err != nil {
			return nil, err
		}
		fs.rs.overlayDone(&s)
		out = append(out, statusOf(t, e, s))
	}
	return out, nil
}

func cutTargetKey(k string) (hexName, kind string, ok bool) {
	rest, ok := strings.CutPrefix(k, layout.TargetPrefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// TargetFilter selects targets for ListTargets.
type TargetFilter struct {
	// State keeps only targets in that state ("" any).
	State TargetState
	// All includes idle targets too: no pending rows, active, no failure
	// in the last day. By default they are left out.
	All bool
	// After resumes a listing after this target name (ListTargets' next).
	After Partition
	// Limit bounds the targets returned (default 100, at most 1000).
	Limit int
}

// recentFailure is how long a recovered target's last error keeps it in
// the default listing.
const recentFailureMS = 24 * 3600 * 1000

func (f TargetFilter) keep(s TargetStatus, nowMS int64) bool {
	if f.State != "" && s.State != f.State {
		return false
	}
	if f.All {
		return true
	}
	return s.Pending > 0 || s.State != StateActive || s.FailedRounds > 0 ||
		(s.LastError != nil && nowMS-s.LastError.AtMS < recentFailureMS)
}

// ListTargets lists source's targets that have undelivered rows, are not
// active, or failed recently (in the 24 hours before now;
// TargetFilter.All: every target the source has figures of, which is every
// target it relayed to but those collected after RelayHandler.
// IdleTargetTTL without activity), in
// target-name order, from the engine's per-target records. next is the
// last target returned when more may follow (pass it as After); empty at
// the end. One call reads at most a few thousand records, so a listing of
// a source with many idle targets may return fewer than Limit targets with
// a next to go on from.
func ListTargets(ctx context.Context, st Store, source Partition, f TargetFilter, now time.Time) (out []TargetStatus, next Partition, err error) {
	if f.State != "" && !f.State.known() {
		// A misspelt state would list nothing, as if no target were in it.
		return nil, "", fmt.Errorf("%w: state %q: want active, quarantined or paused (or empty: any)", ErrInvalidOperatorInput, f.State)
	}
	nowMS := now.UnixMilli()
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	after := ""
	if f.After != "" {
		after = layout.TargetPrefix + targetHex(f.After) + "/~" // past both of its records
	}
	fs, err := readFolds(ctx, st, source)
	if err != nil {
		return nil, "", fmt.Errorf("list targets %s: %w", source, err)
	}
	virt := foldItems(fs, after)
	var pending []Item
	read := 0
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: layout.TargetPrefix, End: layout.TargetEnd, After: after, Limit: 256})
		if err != nil {
			return nil, "", fmt.Errorf("list targets %s: %w", source, err)
		}
		read += len(pg.Items)
		// The folded targets up to this page's end join it.
		n := len(virt)
		if pg.Next != "" {
			n, _ = slices.BinarySearchFunc(virt, pg.Next, func(it Item, k string) int { return strings.Compare(it.Key, k) })
		}
		pending = mergeItems(append(pending, pg.Items...), virt[:n])
		virt = virt[n:]
		// Decode complete groups only: the last target may continue on the
		// next page.
		cut := len(pending)
		if pg.Next != "" && cut > 0 {
			last, _, _ := cutTargetKey(pending[cut-1].Key)
			for cut > 0 {
				h, _, _ := cutTargetKey(pending[cut-1].Key)
				if h != last {
					break
				}
				cut--
			}
		}
		sts, err := targetStatuses(pending[:cut], fs)
		if err != nil {
			return nil, "", fmt.Errorf("list targets %s: %w", source, err)
		}
		for _, s := range sts {
			if f.keep(s, nowMS) {
				out = append(out, s)
				if len(out) == limit {
					return out, s.Target, nil
				}
			}
		}
		pending = append([]Item(nil), pending[cut:]...)
		if pg.Next == "" {
			return out, "", nil
		}
		after = pg.Next
		if read >= 4096 && len(sts) > 0 {
			// Enough for one call: resume after the last decoded target.
			return out, sts[len(sts)-1].Target, nil
		}
	}
}

// GetTarget returns one target's status. ErrUnknownTarget: the source has
// no record of it (it never relayed to it, or its figures were collected
// after RelayHandler.IdleTargetTTL idle).
func GetTarget(ctx context.Context, st Store, source, target Partition) (TargetStatus, error) {
	prefix := layout.TargetPrefix + targetHex(target) + "/"
	fs, err := readFolds(ctx, st, source)
	if err != nil {
		return TargetStatus{}, fmt.Errorf("target %s/%q: %w", source, target, err)
	}
	items, err := scanItems(ctx, st, source, prefix, prefixEnd(prefix))
	if err != nil {
		return TargetStatus{}, fmt.Errorf("target %s/%q: %w", source, target, err)
	}
	if _, ok := fs.os.enqOf(target); ok || fs.rs.hasDone(target) {
		items = mergeItems(items, []Item{{Key: prefix + foldedKind}})
	}
	if len(items) == 0 {
		return TargetStatus{}, fmt.Errorf("target %s/%q: %w", source, target, ErrUnknownTarget)
	}
	sts, err := targetStatuses(items, fs)
	if err != nil || len(sts) != 1 {
		return TargetStatus{}, fmt.Errorf("target %s/%q: %w", source, target, err)
	}
	return sts[0], nil
}

// scanItems reads every item in [start, end) of p, in key order.
func scanItems(ctx context.Context, st Store, p Partition, start, end string) ([]Item, error) {
	var out []Item
	after := ""
	for {
		pg, err := st.Scan(ctx, p, ScanRequest{Start: start, End: end, After: after})
		if err != nil {
			return nil, err
		}
		out = append(out, pg.Items...)
		if pg.Next == "" {
			return out, nil
		}
		after = pg.Next
	}
}
