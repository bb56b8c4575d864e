package relaycore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// SourceState is a source's relay outbox summary, from one scan.
type SourceState struct {
	// LowerBoundMS: every row still in the outbox, and every row committed
	// later, has commit_ms >= LowerBoundMS (see RelayWatermark).
	LowerBoundMS int64
	// Empty: no undelivered rows.
	Empty bool
	// NextSeq is os.next: rows 1..NextSeq-1 have been committed.
	NextSeq uint64
	// FirstUndelivered is the lowest seq still in the outbox (0 when Empty);
	// while rows are held it may be lower than the truth (a lower bound).
	FirstUndelivered uint64
	// HeldRows counts rows held for quarantined, paused or retried targets;
	// HeldOldestMS is a lower bound of their commit times (0: none held).
	HeldRows     uint64
	HeldOldestMS int64
	// Hold is the source's hold summary (its q record) as read: held rows,
	// quarantined and paused targets, as AlarmResult.Hold reports it after
	// an alarm. A replica that did not run the source's last alarm reads
	// its figures here (relay serve's gauges).
	Hold HoldSummary
}

// SourceRelayState returns the source's lower bound and whether its relay
// outbox is empty, in one scan of the partition's head: os and the hold
// summary q sort before the row pages, the first page holds both the
// lowest undelivered seq and, because commit times are monotonic in seq,
// the lowest commit time of the outbox, and q bounds the held rows'.
func SourceRelayState(ctx context.Context, st Store, source Partition, now time.Time) (SourceState, error) {
	s, err := sourceState(ctx, st, source)
	// Smaller is always a valid lower bound; never report the future.
	s.LowerBoundMS = min(s.LowerBoundMS, unixMS(now))
	return s, err
}

func sourceState(ctx context.Context, st Store, source Partition) (SourceState, error) {
	var (
		osRaw    []byte
		osFound  bool
		qRaw     []byte
		qFound   bool
		first    bool
		firstSeq uint64
		firstMS  int64
		after    string
	)
scan:
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: "", End: layout.PageEnd, After: after, Limit: 5})
		if err != nil {
			return SourceState{}, fmt.Errorf("source state %s: %w", source, err)
		}
		for _, it := range pg.Items {
			switch {
			case it.Key == KeyOS:
				osRaw, osFound = it.Value, true
			case it.Key == layout.KeyHold:
				qRaw, qFound = it.Value, true
			case isPageKey(it.Key):
				// Only the header: the rows are not needed.
				if firstSeq, firstMS, err = pageHeader(it.Key, it.Value); err != nil {
					return SourceState{}, fmt.Errorf("source state %s: %w", source, err)
				}
				first = true
				break scan
			}
		}
		if pg.Next == "" {
			break
		}
		after = pg.Next
	}
	os, err := decodeOS(osRaw, osFound)
	if err != nil {
		return SourceState{}, fmt.Errorf("source state %s: %w", source, err)
	}
	hold, err := decodeHold(qRaw, qFound)
	if err != nil {
		return SourceState{}, fmt.Errorf("source state %s: %w", source, err)
	}
	s := SourceState{NextSeq: os.NextSeq, Empty: !first && hold.HeldRows == 0, HeldRows: hold.HeldRows, Hold: HoldSummary(hold),
		LowerBoundMS: undeliveredLowerBound(first, firstMS, os.LastCommitMS, HoldSummary(hold))}
	if first {
		s.FirstUndelivered = firstSeq
	}
	// Held rows (quarantined, paused or retried targets) are undelivered
	// too; q keeps lower bounds of their seqs and commit times.
	if hold.HeldRows > 0 {
		if s.FirstUndelivered == 0 || hold.MinSeq < s.FirstUndelivered {
			s.FirstUndelivered = hold.MinSeq
		}
		s.HeldOldestMS = hold.OldestMS
	}
	return s, nil
}

// undeliveredLowerBound bounds the commit times of a source's undelivered
// rows from below: the first outbox page's (hasPage; commit times grow
// with seq), else the last commit's, lowered to the oldest held row's
// when rows are held (hold: as q, or the last fire, left it).
func undeliveredLowerBound(hasPage bool, pageMS, lastCommitMS int64, hold HoldSummary) int64 {
	lower := lastCommitMS
	if hasPage {
		lower = pageMS
	}
	if hold.HeldRows > 0 {
		lower = min(lower, hold.OldestMS)
	}
	return lower
}

// RelayWatermark is a commit-time lower bound for source's undelivered
// outbox: every undelivered row, and every row committed after the call,
// has commit_ms >= the result. When the outbox is empty it is the last
// commit time (commit times are monotonic per source), never beyond now.
// Consumers must tolerate relay lag: a mid-cycle append waits for the next
// cycle and can exceed RelayLagBoundMS.
func RelayWatermark(ctx context.Context, st Store, source Partition, now time.Time) (int64, error) {
	s, err := SourceRelayState(ctx, st, source, now)
	return s.LowerBoundMS, err
}

// RelayDeliveredThrough reports whether all of source's rows through seq
// have been committed and have left its outbox. Target watermarks advance
// before source cleanup, so true also means every such row is applied at
// its target.
func RelayDeliveredThrough(ctx context.Context, st Store, source Partition, seq uint64) (bool, error) {
	s, err := sourceState(ctx, st, source)
	if err != nil {
		return false, err
	}
	if seq >= s.NextSeq {
		return false, nil
	}
	return s.Empty || s.FirstUndelivered > seq, nil
}

// TargetWatermark returns target's rh for source: the last seq of source
// applied there (0: none).
func TargetWatermark(ctx context.Context, st Store, target, source Partition) (uint64, error) {
	raw, found, err := st.Get(ctx, target, RHKey(source))
	if err != nil {
		return 0, fmt.Errorf("read rh %s/%s: %w", target, source, err)
	}
	return decodeRH(raw, found)
}

// SourceView is everything relay keeps in a source partition, decoded. For
// the simulation's invariant checks and operators; it reads the whole
// partition.
type SourceView struct {
	OS      OutboxState
	OSFound bool
	RS      *RelayState
	Lease   *Lease
	Alarm   *AlarmRecord
	Pages   []Page
	// Hold is the hold summary (q).
	Hold HoldSummary
	// Targets are the per-target records, in target-name order.
	Targets []TargetStatus
	// Held are the held pages (u/), by target then seq.
	Held []Page
	// Retries are the retry markers (v/), by due time.
	Retries []RetryMarker
	// Archive is the dead-row archive (w/), by id.
	Archive []ArchiveEntry
	// Idempotency lists the keys of idempotency records (IdemPrefix).
	Idempotency []string
	// Other lists keys relay does not own (there should be none).
	Other []string
}

// Rows returns every undelivered row, in the outbox or held, in seq order.
func (v SourceView) Rows() []Row {
	var out []Row
	for _, p := range v.Pages {
		out = append(out, p.Rows...)
	}
	if len(v.Held) > 0 {
		for _, p := range v.Held {
			out = append(out, p.Rows...)
		}
		slices.SortFunc(out, func(a, b Row) int { return cmpU64(a.Seq, b.Seq) })
	}
	return out
}

// InspectSource reads and decodes source's whole partition.
func InspectSource(ctx context.Context, st Store, source Partition) (SourceView, error) {
	return (*SourceInspector)(nil).Inspect(ctx, st, source)
}
