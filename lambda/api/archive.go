package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/relay-dev/relay/relaycore"
)

// ArchiveSummary is an archive entry without its rows (GET .../archive).
type ArchiveSummary struct {
	ID     uint64 `json:"id"`
	Target string `json:"target"`
	// TargetHex is set when the name is not valid UTF-8
	// (relaycore.TargetNameHex).
	TargetHex string               `json:"target_hex,omitempty"`
	First     uint64               `json:"first"`
	Last      uint64               `json:"last"`
	Rows      int                  `json:"rows"`
	By        string               `json:"by,omitempty"`
	Reason    string               `json:"reason"`
	AtMS      int64                `json:"at_ms"`
	LastError *relaycore.LastError `json:"last_error,omitempty"`
	// Requeued holds the seqs the rows got when re-enqueued.
	Requeued []uint64 `json:"requeued,omitempty"`
}

// ArchiveListResponse answers GET .../archive.
type ArchiveListResponse struct {
	Source  string           `json:"source"`
	Entries []ArchiveSummary `json:"entries"`
	// Next, when non-zero, is the after= of the next page.
	Next uint64 `json:"next,omitempty"`
}

// ArchivedRow is one skipped row with its original seq and commit time;
// values are standard base64, as in the enqueue body.
type ArchivedRow struct {
	Seq      uint64    `json:"seq"`
	CommitMS int64     `json:"commit_ms"`
	Puts     []PutJSON `json:"puts,omitempty"`
	Deletes  []string  `json:"deletes,omitempty"`
}

// ArchiveEntryJSON is an archive entry with its rows (GET .../archive/{entry}
// and the export). In an export page an entry too large for one page is
// split: RowsFrom is the index of its first row here, and Partial says
// more of its rows follow on the next page.
type ArchiveEntryJSON struct {
	ArchiveSummary
	RowsFrom int           `json:"rows_from,omitempty"`
	Partial  bool          `json:"partial,omitempty"`
	Data     []ArchivedRow `json:"data"`
}

// ArchiveExportResponse is one export page. Next, when non-empty, is the
// cursor= of the next page; the export is complete when it is empty.
type ArchiveExportResponse struct {
	Source  string             `json:"source"`
	Entries []ArchiveEntryJSON `json:"entries"`
	Next    string             `json:"next,omitempty"`
}

// RequeueResponse answers POST .../archive/{entry}/requeue.
type RequeueResponse struct {
	Source string   `json:"source"`
	ID     uint64   `json:"id"`
	Seqs   []uint64 `json:"seqs"`
}

// maxArchiveList bounds one archive listing page: ListArchive reads each
// entry's rows too (up to one source batch each).
const maxArchiveList = 100

func summary(e relaycore.ArchiveEntry) ArchiveSummary {
	return ArchiveSummary{ID: e.ID, Target: string(e.Target), TargetHex: relaycore.TargetNameHex(e.Target), First: e.First, Last: e.Last, Rows: len(e.Rows),
		By: e.By, Reason: e.Reason, AtMS: e.AtMS, LastError: e.LastError, Requeued: e.Requeued}
}

func archivedRows(rows []relaycore.Row) []ArchivedRow {
	out := make([]ArchivedRow, len(rows))
	for i, r := range rows {
		a := ArchivedRow{Seq: r.Seq, CommitMS: r.CommitMS, Deletes: r.Deletes}
		for _, p := range r.Puts {
			v := base64.StdEncoding.EncodeToString(p.Value)
			a.Puts = append(a.Puts, PutJSON{Key: p.Key, Value: &v})
		}
		out[i] = a
	}
	return out
}

func (h *Handler) listArchive(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	q, e := query(req, "after", "limit")
	if e != nil {
		return nil, e
	}
	after, limit := uint64(0), 20
	if v, ok := q["after"]; ok {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fail(400, "bad_request", "after %q is not an archive id", v)
		}
		after = n
	}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxArchiveList {
			return nil, fail(400, "bad_request", "limit %q: want 1..%d", v, maxArchiveList)
		}
		limit = n
	}
	es, next, err := relaycore.ListArchive(ctx, h.Source, m.source, after, limit)
	if err != nil {
		return nil, err
	}
	out := ArchiveListResponse{Source: string(m.source), Entries: []ArchiveSummary{}, Next: next}
	for _, e := range es {
		out.Entries = append(out.Entries, summary(e))
	}
	return out, nil
}

func (h *Handler) getArchive(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	if _, e := query(req); e != nil {
		return nil, e
	}
	e, _, err := relaycore.GetArchive(ctx, h.Source, m.source, m.entry)
	if err != nil {
		return nil, operatorError(err)
	}
	return ArchiveEntryJSON{ArchiveSummary: summary(e), Data: archivedRows(e.Rows)}, nil
}

// exportCursor is where an export page starts: after entry After, or (Row
// > 0) at row Row of entry Entry.
type exportCursor struct {
	after, entry uint64
	row          int
}

func parseCursor(s string) (exportCursor, error) {
	if s == "" {
		return exportCursor{}, nil
	}
	id, row, split := strings.Cut(s, ".")
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return exportCursor{}, fmt.Errorf("cursor %q", s)
	}
	if !split {
		return exportCursor{after: n}, nil
	}
	r, err := strconv.Atoi(row)
	if err != nil || r <= 0 || n == 0 {
		return exportCursor{}, fmt.Errorf("cursor %q", s)
	}
	return exportCursor{entry: n, row: r}, nil
}

// exportArchive answers one page of the export: whole entries with their
// rows, in id order, until the next row would take the body past
// MaxExportBytes; an entry larger than a page is split across pages (at
// least one row per page, so the export always progresses). Pages are
// read independently: entries skipped meanwhile appear on later pages.
func (h *Handler) exportArchive(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	q, e := query(req, "cursor")
	if e != nil {
		return nil, e
	}
	cur, err := parseCursor(q["cursor"])
	if err != nil {
		return nil, fail(400, "bad_request", "%v: pass the next of the previous page", err)
	}
	budget := h.maxExportBytes()
	out := ArchiveExportResponse{Source: string(m.source), Entries: []ArchiveEntryJSON{}}
	size := 64 + len(m.source)
	add := func(e relaycore.ArchiveEntry, from int) (done bool) {
		ej := ArchiveEntryJSON{ArchiveSummary: summary(e), RowsFrom: from, Data: []ArchivedRow{}}
		head, _ := json.Marshal(ej)
		size += len(head) + 1
		for i, r := range archivedRows(e.Rows[from:]) {
			b, _ := json.Marshal(r)
			if size+len(b)+1 > budget && (len(out.Entries) > 0 || i > 0) {
				if i > 0 {
					ej.Partial = true
					out.Entries = append(out.Entries, ej)
					out.Next = fmt.Sprintf("%d.%d", e.ID, from+i)
				} else {
					out.Next = strconv.FormatUint(prevID(out), 10)
				}
				return true
			}
			size += len(b) + 1
			ej.Data = append(ej.Data, r)
		}
		out.Entries = append(out.Entries, ej)
		return false
	}
	if cur.entry != 0 {
		e, _, err := relaycore.GetArchive(ctx, h.Source, m.source, cur.entry)
		if err != nil {
			return nil, operatorError(err)
		}
		if cur.row >= len(e.Rows) {
			return nil, fail(400, "bad_request", "cursor row %d: entry %d holds %d rows", cur.row, e.ID, len(e.Rows))
		}
		if add(e, cur.row) {
			return out, nil
		}
		cur.after = e.ID
	}
	for {
		es, next, err := relaycore.ListArchive(ctx, h.Source, m.source, cur.after, 8)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			if add(e, 0) {
				return out, nil
			}
			cur.after = e.ID
		}
		if next == 0 {
			return out, nil
		}
	}
}

// prevID is the id of the last whole entry on the page (the next page
// starts after it).
func prevID(out ArchiveExportResponse) uint64 {
	return out.Entries[len(out.Entries)-1].ID
}

func (h *Handler) requeue(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	var in struct{}
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	var seqs []uint64
	var err error
	if h.legacyEnqueue() {
		//lint:ignore SA1019 the deprecated Handler.Enqueue field keeps its meaning for one release
		seqs, err = relaycore.Requeue(ctx, h.Source, h.clock(), m.source, m.entry, h.Enqueue)
	} else {
		seqs, err = h.Relay.Requeue(ctx, m.source, m.entry)
	}
	if err != nil {
		if e := operatorError(err); e != err {
			return nil, e
		}
		return nil, enqueueError(err, relaycore.CommitResult{})
	}
	log.Info("api: archive requeued", "source", string(m.source), "id", m.entry, "seqs", len(seqs), "by", actorOf(req.Caller))
	return RequeueResponse{Source: string(m.source), ID: m.entry, Seqs: seqs}, nil
}
