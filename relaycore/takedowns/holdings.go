package takedowns

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/relaycore"
)

// Report is one holder report (edge/takedown.Report: one declaration for
// the relay and edged).
type Report = takedown.Report

// States of a report.
const (
	StateHeld    = takedown.StateHeld
	StateEvicted = takedown.StateEvicted
)

// MaxReports bounds the reports of one call (the contract's 1..500).
const MaxReports = 500

// CheckNode reports why node cannot be a node id (edge/wire's rule, which
// relaycore's takedown requests follow), or nil.
func CheckNode(node string) error {
	t := relaycore.ContentTakedownV1{Version: 1, ContentID: "x", LateHolder: node, RequestedMS: 1, Reason: "x"}
	if err := t.Validate(); err != nil {
		return invalid("node id %q: 1..64 bytes of [A-Za-z0-9._-], not starting with '.' or '-'", node)
	}
	return nil
}

// CheckContent reports why content cannot be a content (segment) id, or nil.
func CheckContent(content string) error {
	t := relaycore.ContentTakedownV1{Version: 1, ContentID: content, LateHolder: "x", RequestedMS: 1, Reason: "x"}
	if err := t.Validate(); err != nil {
		return invalid("content id %q: 1..128 bytes of [A-Za-z0-9._-], not starting with '.' or '-'", content)
	}
	return nil
}

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

func validateReport(r Report, i int) error {
	if err := CheckContent(r.ContentID); err != nil {
		return invalid("reports[%d]: %v", i, err)
	}
	switch {
	case !validDigest(r.SHA256):
		return invalid("reports[%d]: sha256 must be 64 lowercase hex digits", i)
	case r.Size < 0:
		return invalid("reports[%d]: size %d is negative", i, r.Size)
	case r.State != StateHeld && r.State != StateEvicted:
		return invalid("reports[%d]: state %q: want held or evicted", i, r.State)
	case r.ObservedMS <= 0 || r.ObservedMS >= 253402300800000:
		return invalid("reports[%d]: observed_ms %d out of range", i, r.ObservedMS)
	}
	return nil
}

// holderValue is a report as the index keeps it (content and node are in
// the key).
type holderValue struct {
	V          int    `json:"v"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
	State      string `json:"state"`
	ObservedMS int64  `json:"observed_ms"`
}

// ReportResult answers Report.
type ReportResult struct {
	Accepted int
	// Replayed: the same key and reports were committed before; nothing
	// was written now.
	Replayed bool
}

// Report applies node's reports, in their order, under the caller's
// idempotency key (the contract's Idempotency-Key header): the same key
// with the same reports again writes nothing and answers Replayed; the
// same key with other reports fails with relaycore.ErrIdempotencyKeyReused.
// They go through node's own source, so one node's reports reach the index
// in the order it sent them and a later report of a content replaces an
// earlier one.
func (o *Owner) Report(ctx context.Context, node, key string, reports []Report) (ReportResult, error) {
	if err := CheckNode(node); err != nil {
		return ReportResult{}, err
	}
	switch {
	case len(reports) == 0:
		return ReportResult{}, invalid("reports is empty")
	case len(reports) > MaxReports:
		return ReportResult{}, invalid("%d reports, limit %d per request", len(reports), MaxReports)
	}
	rows := make([]relaycore.Row, len(reports))
	for i, r := range reports {
		if err := validateReport(r, i); err != nil {
			return ReportResult{}, err
		}
		v, _ := json.Marshal(holderValue{V: 1, SHA256: r.SHA256, Size: r.Size, State: r.State, ObservedMS: r.ObservedMS})
		rows[i] = relaycore.Row{Target: HoldersTarget(r.ContentID), Puts: []relaycore.KV{{Key: holderKey(r.ContentID, node), Value: v}}}
	}
	res, err := o.enqueue(ctx, HoldingsSource(node), idemKey("h", key), rows)
	if err != nil {
		return ReportResult{}, err
	}
	return ReportResult{Accepted: len(reports), Replayed: res.Replayed}, nil
}

// Holder is what the index knows of one node's copy of a content: its last
// report, and when the relay committed that report (ReportedMS, the
// relay's clock; ObservedMS is the node's).
type Holder struct {
	Node       string `json:"node"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
	State      string `json:"state"`
	ObservedMS int64  `json:"observed_ms"`
	ReportedMS int64  `json:"reported_ms"`
	// Seq is the seq of the report in the node's source (HoldingsSource):
	// it grows with every report the node makes, so it says, without
	// comparing clocks, whether a report came after another (a waiver
	// records the one it saw).
	Seq uint64 `json:"-"`
}

// Holders lists what the index holds for content, by node: every node that
// ever reported it, held or evicted. It reads the index as delivered: a
// report committed a moment ago may not be in it yet.
func (o *Owner) Holders(ctx context.Context, content string) ([]Holder, error) {
	if err := CheckContent(content); err != nil {
		return nil, err
	}
	items, err := o.readAll(ctx, HoldersTarget(content), content+"/")
	if err != nil {
		return nil, err
	}
	by := map[string]*Holder{}
	get := func(node string) *Holder {
		if h := by[node]; h != nil {
			return h
		}
		h := &Holder{Node: node}
		by[node] = h
		return h
	}
	for _, it := range items {
		rest := strings.TrimPrefix(it.Key, content+"/")
		if node, ok := strings.CutSuffix(rest, reportAtTail); ok {
			var at reportAt
			if err := json.Unmarshal(it.Value, &at); err != nil {
				return nil, fmt.Errorf("%w: holder index %s: %v", relaycore.ErrCorruptRecord, it.Key, err)
			}
			h := get(node)
			h.ReportedMS, h.Seq = at.ReportedMS, at.Seq
			continue
		}
		var v holderValue
		if err := json.Unmarshal(it.Value, &v); err != nil || v.V != 1 {
			return nil, fmt.Errorf("%w: holder index %s: %q", relaycore.ErrCorruptRecord, it.Key, it.Value)
		}
		h := get(rest)
		h.SHA256, h.Size, h.State, h.ObservedMS = v.SHA256, v.Size, v.State, v.ObservedMS
	}
	out := make([]Holder, 0, len(by))
	for _, h := range by {
		if h.State == "" {
			continue // an "/at" whose report is in the same batch: never alone
		}
		out = append(out, *h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}
