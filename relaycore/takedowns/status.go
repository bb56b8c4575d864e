package takedowns

import (
	"context"
	"crypto/x509"
	"sort"
	"time"

	"github.com/relay-dev/relay/edge/takedown"
)

// Holder states in a Status.
const (
	// HolderEvicted: a verified receipt for the holder's latest request.
	HolderEvicted = "evicted"
	// HolderWaived: an operator waived the holder's receipt.
	HolderWaived = "waived"
	// HolderPending: requested, no verified receipt yet.
	HolderPending = "pending"
	// HolderUnrequested: the index says the node holds the content and no
	// request has reached the takedown yet (a late holder the owner has
	// still to request). It counts as expected: it holds the content.
	HolderUnrequested = "unrequested"
)

// Status is a takedown's state, as GET /v1/takedowns/{id} answers it.
type Status struct {
	Takedown
	// Complete: every expected holder has a verified receipt or a waiver.
	// Never true while one is pending; it can turn false again if a late
	// holder reports the content.
	Complete         bool           `json:"complete"`
	HoldersExpected  int            `json:"holders_expected"`
	ReceiptsVerified int            `json:"receipts_verified"`
	Waived           int            `json:"waived"`
	Pending          int            `json:"pending"`
	Overdue          int            `json:"overdue"`
	Holders          []HolderStatus `json:"holders"`
}

// HolderStatus is one expected holder of a takedown.
type HolderStatus struct {
	Node  string `json:"node"`
	State string `json:"state"`
	// SHA256 is the digest the index has for the node's copy; ReportState,
	// ObservedMS and LastReportMS its last report (LastReportMS: when the
	// relay committed it).
	SHA256       string `json:"sha256,omitempty"`
	ReportState  string `json:"report_state,omitempty"`
	ObservedMS   int64  `json:"observed_ms,omitempty"`
	LastReportMS int64  `json:"last_report_ms,omitempty"`
	// Request is the node's latest request; Ordered whether its order is
	// in the node's order partition; TimerDueMS when it is overdue.
	Request     string  `json:"request,omitempty"`
	RequestedMS int64   `json:"requested_ms,omitempty"`
	Requests    int     `json:"requests,omitempty"`
	Ordered     bool    `json:"ordered"`
	TimerDueMS  int64   `json:"timer_due_ms,omitempty"`
	Overdue     bool    `json:"overdue"`
	EvictedAt   string  `json:"evicted_at,omitempty"`
	Waiver      *Waiver `json:"waiver,omitempty"`
	Refusal     string  `json:"receipt_problem,omitempty"`
}

// status computes v's Status at now. A stored receipt is verified again
// against roots (it was when accepted; a changed CA file shows here), and
// one that no longer verifies counts as missing.
func (v *view) status(now time.Time, roots *x509.CertPool) Status {
	st := Status{Takedown: v.meta}
	nodes := map[string]bool{}
	for _, t := range v.requests {
		nodes[t.LateHolder] = true
	}
	for n, h := range v.holders {
		if h.State == StateHeld {
			nodes[n] = true
		}
	}
	for n := range nodes {
		hs := HolderStatus{Node: n}
		if h, ok := v.holders[n]; ok {
			hs.SHA256, hs.ReportState, hs.ObservedMS, hs.LastReportMS = h.SHA256, h.State, h.ObservedMS, h.ReportedMS
		}
		t, requested := v.latest(n)
		if requested {
			hs.Request, hs.RequestedMS = requestSuffix(t), t.RequestedMS
			_, hs.Ordered = v.ordered[hs.Request]
			for _, r := range v.requests {
				if r.LateHolder == n {
					hs.Requests++
				}
			}
			if ho, ok := v.handoffs[hs.Request]; ok {
				hs.TimerDueMS = ho.TimerDueMS
			}
			if line, ok := v.receipts[hs.Request]; ok {
				if at, err := verifyStored(line, roots, now); err != nil {
					hs.Refusal = err.Error()
				} else {
					hs.EvictedAt = at.UTC().Format(time.RFC3339Nano)
				}
			}
		}
		_, covered := v.covering(n)
		hs.Waiver = v.waiverOf(n)
		if h, ok := v.holders[n]; ok && hs.EvictedAt != "" && h.State == StateHeld {
			// The node reported holding the content after the eviction
			// it proved (its own clock on both): it holds it again, and
			// the owner is to request it anew.
			if at, err := time.Parse(time.RFC3339Nano, hs.EvictedAt); err == nil && h.ObservedMS > at.UnixMilli() {
				hs.EvictedAt, requested = "", false
			}
		}
		switch {
		case hs.EvictedAt != "":
			hs.State = HolderEvicted
			st.ReceiptsVerified++
		case covered:
			hs.State = HolderWaived
			st.Waived++
		case requested:
			hs.State = HolderPending
			st.Pending++
			if hs.TimerDueMS != 0 && hs.TimerDueMS <= now.UnixMilli() {
				hs.Overdue = true
				st.Overdue++
			}
		default:
			hs.State = HolderUnrequested
			st.Pending++
		}
		st.Holders = append(st.Holders, hs)
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].Node < st.Holders[j].Node })
	st.HoldersExpected = len(st.Holders)
	st.Complete = st.Pending == 0
	if st.Holders == nil {
		st.Holders = []HolderStatus{}
	}
	return st
}

func verifyStored(line []byte, roots *x509.CertPool, now time.Time) (time.Time, error) {
	if roots == nil {
		return time.Time{}, ErrNoCA
	}
	s, err := takedown.ParseLine(line)
	if err != nil {
		return time.Time{}, err
	}
	if _, err := takedown.Verify(s, roots, now); err != nil {
		return time.Time{}, err
	}
	return s.Receipt.EvictedAt, nil
}

// Status reads takedown id's status.
func (o *Owner) Status(ctx context.Context, id string) (Status, error) {
	v, err := o.load(ctx, id)
	if err != nil {
		return Status{}, err
	}
	return v.status(o.now(), o.Roots), nil
}

// Receipts returns takedown id's accepted receipts as a receipt file
// (docs/takedown.md: one line each, "\n" after every line), ordered by
// request: what a third party checks with `edgectl takedown verify FILE
// --ca ca.crt`.
func (o *Owner) Receipts(ctx context.Context, id string) ([]byte, error) {
	v, err := o.load(ctx, id)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(v.receipts))
	for k := range v.receipts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []byte
	for _, k := range keys {
		out = append(append(out, v.receipts[k]...), '\n')
	}
	return out, nil
}

// verifyStoredForm reads a stored receipt's eviction time: the receipt
// was verified when accepted.
func verifyStoredForm(line []byte) (time.Time, error) {
	s, err := takedown.ParseLine(line)
	if err != nil {
		return time.Time{}, err
	}
	return s.Receipt.EvictedAt, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
