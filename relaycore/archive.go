package relaycore

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// ArchiveEntry is one skip in the dead-row archive: the rows an operator
// skipped, with who, why, when and the target's last error. Rows carry
// their original seqs and commit times.
type ArchiveEntry struct {
	ID        uint64     `json:"id"`
	Target    Partition  `json:"target"`
	First     uint64     `json:"first"`
	Last      uint64     `json:"last"`
	By        string     `json:"by,omitempty"`
	Reason    string     `json:"reason"`
	AtMS      int64      `json:"at_ms"`
	LastError *LastError `json:"last_error,omitempty"`
	Rows      []Row      `json:"rows"`
	// Requeued holds the seqs the rows got when re-enqueued (in row order).
	Requeued []uint64 `json:"requeued,omitempty"`
}

// archiveEntries groups w/ items: an entry record followed by its pages.
func archiveEntries(items []Item) ([]ArchiveEntry, error) {
	var out []ArchiveEntry
	for _, it := range items {
		rest := strings.TrimPrefix(it.Key, layout.DeadPrefix)
		idHex, pageHex, isPage := strings.Cut(rest, "/")
		id, err := strconv.ParseUint(idHex, 16, 64)
		if err != nil || len(idHex) != 16 {
			return nil, fmt.Errorf("%w: archive key %q", ErrCorruptRecord, it.Key)
		}
		if !isPage {
			var d deadEntry
			if err := json.Unmarshal(it.Value, &d); err != nil {
				return nil, fmt.Errorf("%w: archive entry %q", ErrCorruptRecord, it.Key)
			}
			t, err := hex.DecodeString(d.TargetHex)
			if err != nil {
				return nil, fmt.Errorf("%w: archive entry %q", ErrCorruptRecord, it.Key)
			}
			out = append(out, ArchiveEntry{ID: id, Target: Partition(t), First: d.First, Last: d.Last, By: d.By,
				Reason: d.Reason, AtMS: d.AtMS, LastError: d.LastError, Requeued: d.Requeued})
			continue
		}
		if len(out) == 0 || out[len(out)-1].ID != id || len(pageHex) != 16 {
			return nil, fmt.Errorf("%w: archive page %q without its entry", ErrCorruptRecord, it.Key)
		}
		p, err := decodePage(it.Key, it.Value)
		if err != nil {
			return nil, err
		}
		out[len(out)-1].Rows = append(out[len(out)-1].Rows, p.Rows...)
	}
	return out, nil
}

// ListArchive returns up to limit archive entries of source with ids after
// after (0: from the start), in id (first skipped seq) order, with their
// rows. next is the last id returned when more may follow.
func ListArchive(ctx context.Context, st Store, source Partition, after uint64, limit int) (out []ArchiveEntry, next uint64, err error) {
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	cursor := ""
	if after > 0 {
		cursor = deadKey(after) + "/~" // past the entry and its pages
	}
	var items []Item
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{Start: layout.DeadPrefix, End: layout.DeadEnd, After: cursor, Limit: 256})
		if err != nil {
			return nil, 0, fmt.Errorf("list archive %s: %w", source, err)
		}
		for _, it := range pg.Items {
			if !strings.Contains(strings.TrimPrefix(it.Key, layout.DeadPrefix), "/") {
				if n := countEntries(items); n == limit {
					es, err := archiveEntries(items)
					return es, es[len(es)-1].ID, err
				}
			}
			items = append(items, it)
		}
		if pg.Next == "" {
			es, err := archiveEntries(items)
			return es, 0, err
		}
		cursor = pg.Next
	}
}

func countEntries(items []Item) int {
	n := 0
	for _, it := range items {
		if !strings.Contains(strings.TrimPrefix(it.Key, layout.DeadPrefix), "/") {
			n++
		}
	}
	return n
}

// GetArchive returns one archive entry; ErrArchiveNotFound if none has id.
func GetArchive(ctx context.Context, st Store, source Partition, id uint64) (ArchiveEntry, []byte, error) {
	items, err := scanItems(ctx, st, source, deadKey(id), deadKey(id)+"0")
	if err != nil {
		return ArchiveEntry{}, nil, fmt.Errorf("archive %s/%d: %w", source, id, err)
	}
	if len(items) == 0 || items[0].Key != deadKey(id) {
		return ArchiveEntry{}, nil, fmt.Errorf("archive %s/%d: %w", source, id, ErrArchiveNotFound)
	}
	es, err := archiveEntries(items)
	if err != nil {
		return ArchiveEntry{}, nil, err
	}
	return es[0], items[0].Value, nil
}

// Requeue enqueues an archive entry's rows again, for the same target, as
// new rows (new seqs, in their original order), once: the enqueue uses the
// idempotency key "requeue:<id in hex>" and the entry records the new seqs,
// so a retry after a lost answer (or a second requeue) returns the same
// seqs and commits nothing.
//
// Deprecated: use RelayHandler.Requeue, which takes the store, clock and
// enqueue tuning from the handler. Requeue stays for one release
// (CHANGELOG.md).
func Requeue(ctx context.Context, st Store, clock Clock, source Partition, id uint64, cfg EnqueueConfig) ([]uint64, error) {
	entry, raw, err := GetArchive(ctx, st, source, id)
	if err != nil {
		return nil, err
	}
	if len(entry.Requeued) > 0 {
		return entry.Requeued, nil
	}
	if len(entry.Rows) == 0 {
		return nil, fmt.Errorf("requeue %s/%d: %w: the entry holds no rows", source, id, ErrInvalidOperatorInput)
	}
	rows := make([]Row, len(entry.Rows))
	for i, r := range entry.Rows {
		rows[i] = Row{Target: entry.Target, Puts: r.Puts, Deletes: r.Deletes}
	}
	cfg.IdempotencyKey = "requeue:" + fmt.Sprintf("%016x", id)
	res, err := commitRelayRows(ctx, st, clock, source, nil, time.Time{}, rows, cfg)
	if err != nil {
		return nil, fmt.Errorf("requeue %s/%d: %w", source, id, err)
	}
	var d deadEntry
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%w: archive entry %d", ErrCorruptRecord, id)
	}
	d.Requeued = res.Seqs
	nv := encodeJSON(d)
	if bytes.Equal(nv, raw) {
		return res.Seqs, nil
	}
	err = st.Apply(ctx, source, Batch{Preconditions: []Precondition{{Key: deadKey(id), Value: raw}}, Writes: []Write{{Key: deadKey(id), Value: nv}}})
	if err != nil && !MayBeApplied(err) {
		if _, ok := FailedPrecondition(err); !ok {
			return res.Seqs, fmt.Errorf("requeue %s/%d: record the new seqs: %w", source, id, err)
		}
	}
	return res.Seqs, nil
}
