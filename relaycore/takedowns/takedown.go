package takedowns

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/relaycore"
)

// Takedown is a takedown's record ("meta"): what was asked, by whom, when
// and why. It is written once, with the first requests, and never changed.
type Takedown struct {
	V           int    `json:"v"`
	ID          string `json:"id"`
	ContentID   string `json:"content_id"`
	Reason      string `json:"reason"`
	RequestedBy string `json:"requested_by"`
	RequestedMS int64  `json:"requested_ms"`
	// IdempotencyKey is the key the request was made with
	// (RequestOptions), if any: with RequestedBy, it finds the takedown
	// again when the request is retried.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// RequestOptions are a takedown request's options.
type RequestOptions struct {
	// IdempotencyKey (1..128 bytes of [A-Za-z0-9._:-]), when set, makes
	// the request safe to retry: a request by the same caller with the
	// same key, content and reason, within the relay's idempotency TTL
	// (RelayHandler.IdempotencyTTL, 24 h by default), answers the
	// takedown the first one opened (Opened.Replayed) and opens none; with
	// another content or reason it fails with
	// relaycore.ErrIdempotencyKeyReused. Without a key, a retry after a
	// lost answer opens a second takedown of the same content.
	IdempotencyKey string
}

// Opened is what Request answers: the takedown, the holders it requested
// at once (sorted), and whether it was opened by an earlier request with
// the same idempotency key (then nothing was written).
type Opened struct {
	Takedown Takedown
	Holders  []string
	Replayed bool
}

// Order is one order in a node's order partition (edge/takedown.Order:
// one declaration for the relay and edged). Cursor is set when read (GET
// /v1/orders), never stored.
type Order = takedown.Order

// Waiver is an operator's decision that a holder need not prove its
// eviction (a device destroyed, a node gone for good): who, when, why.
// It releases the copy the operator knew of, not the node for good: a
// node that reports holding the content after the waiver is a late holder
// again (issue 23: a node that reports the content after a request gets a
// request of its own), and a waiver covers the node's requests up to its
// time only.
type Waiver struct {
	By     string `json:"by"`
	Reason string `json:"reason"`
	AtMS   int64  `json:"at_ms"`
	// ReportSeq is the node's report in the holder index when the waiver
	// was made (Holder.Seq; 0: none): a held report with a greater seq
	// came after it.
	ReportSeq uint64 `json:"report_seq"`
	// Earlier are the node's waivers before this one, oldest first (a
	// node waived, then heard of again, then silent for good is waived
	// anew). Each waiver is a key of its own in the takedown's partition
	// ("waive/<node>/<key>"), so no waiver ever replaces another; Earlier
	// is filled in when read, never stored.
	Earlier []Waiver `json:"earlier,omitempty"`
}

// MaxReasonLen bounds a takedown's or a waiver's reason (relaycore's
// takedown request limit).
const MaxReasonLen = 1024

func checkReason(r string) error {
	if r == "" || len(r) > MaxReasonLen || !utf8.ValidString(r) || strings.ContainsFunc(r, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return invalid("reason must be 1..%d bytes of UTF-8 text without control characters", MaxReasonLen)
	}
	return nil
}

// checkID refuses what cannot be a takedown id (New's form: digits, '-',
// hex), before it names a partition.
func checkID(id string) error {
	if len(id) < 1 || len(id) > 64 || strings.Trim(id, "0123456789abcdef-") != "" {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}

// Request opens a takedown of content: it resolves the holders the index
// knows now (state held) into one relaycore.ContentTakedownV1 each, and
// enqueues, through the control source, the takedown's record, its entry
// in the open list and those requests. by is the verified caller, kept as
// the audit's "who". A holder missing from the requests (a report the
// index had not received yet, a commit cut short) is a late holder to the
// owner, which requests it itself.
//
// With opts.IdempotencyKey, the record and the open-list entry commit
// first, as one idempotent enqueue, and the holders' requests after: a
// request cut short between the two is a takedown without requests, whose
// holders the owner requests as late holders, and its retry answers that
// takedown. A retry finds the takedown in the open list; until the relay
// has delivered the first request's record there it fails with ErrNotYet.
func (o *Owner) Request(ctx context.Context, content, reason, by string, opts RequestOptions) (Opened, error) {
	if err := CheckContent(content); err != nil {
		return Opened{}, err
	}
	if err := checkReason(reason); err != nil {
		return Opened{}, err
	}
	key := opts.IdempotencyKey
	if key != "" {
		if err := relaycore.ValidIdempotencyKey(key); err != nil {
			return Opened{}, invalid("%v", err)
		}
	}
	holders, err := o.Holders(ctx, content)
	if err != nil {
		return Opened{}, err
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return Opened{}, err
	}
	now := o.now().UnixMilli()
	td := Takedown{V: 1, ID: fmt.Sprintf("%013d-%s", now, hex.EncodeToString(rnd[:])), ContentID: content,
		Reason: reason, RequestedBy: by, RequestedMS: now, IdempotencyKey: key}
	meta, _ := json.Marshal(td)
	target := TakedownTarget(td.ID)
	rows := []relaycore.Row{
		{Target: OpenTarget, Puts: []relaycore.KV{{Key: td.ID, Value: meta}}},
		{Target: target, Puts: []relaycore.KV{{Key: keyMeta, Value: meta}}},
	}
	var requests []relaycore.Row
	nodes := []string{}
	for _, h := range holders {
		if h.State != StateHeld {
			continue
		}
		row, err := relaycore.NewTakedownRow(target, relaycore.ContentTakedownV1{Version: 1, ContentID: content,
			LateHolder: h.Node, RequestedMS: now, Reason: reason})
		if err != nil {
			return Opened{}, err
		}
		requests = append(requests, row)
		nodes = append(nodes, h.Node)
	}
	if key == "" {
		rows, requests = append(rows, requests...), nil
	}
	res, err := o.Relay.Enqueue(ctx, ControlSource, rows, relaycore.EnqueueOptions{IdempotencyKey: requestIdemKey(by, key)})
	if errors.Is(err, relaycore.ErrIdempotencyKeyReused) || err == nil && res.Replayed {
		return o.replay(ctx, content, reason, by, key)
	}
	if err != nil {
		return Opened{}, err
	}
	o.log().Info("takedown requested", "takedown", td.ID, "content_id", content, "by", by, "reason", reason,
		"requested_ms", now, "holders", nodes, "idempotency_key", key)
	if len(requests) > 0 {
		if _, err := o.Relay.Enqueue(ctx, ControlSource, requests, relaycore.EnqueueOptions{}); err != nil {
			// Open without these requests: the owner makes the same ones
			// (lateRequest: a holder without a request, at the takedown's
			// time), and a retry with the key answers this takedown.
			// Not "nothing was changed": the takedown is open. %v, not %w,
			// so the store's error does not choose the answer.
			return Opened{}, fmt.Errorf("%w: takedown %s is open, its holders' requests did not commit with it (the owner makes them): retry with the same idempotency key for its record (%v)", ErrNotYet, td.ID, err)
		}
	}
	return Opened{Takedown: td, Holders: nodes}, nil
}

// requestIdemKey is the relay idempotency key of a takedown request by
// caller by with key (none without one): a digest, so that every caller
// has keys of its own and any caller name fits the key's alphabet.
func requestIdemKey(by, key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(by + "\x00" + key))
	return "takedown:" + hex.EncodeToString(sum[:16])
}

// replay answers a retried request: the open takedown by caller by with
// key, which must be of the same content and reason.
func (o *Owner) replay(ctx context.Context, content, reason, by, key string) (Opened, error) {
	open, err := o.readAll(ctx, OpenTarget, "")
	if err != nil {
		return Opened{}, err
	}
	// The key's record answers for the relay's idempotency TTL; a takedown
	// the same caller opened with the same key before that is another
	// request's (a key used again after it expired), not this one's. Of
	// those left, the newest.
	ttl := o.Relay.IdempotencyTTL
	if ttl <= 0 {
		ttl = defaultIdempotencyTTL
	}
	since := o.now().Add(-ttl - replaySkew).UnixMilli()
	var match *Takedown
	for _, kv := range open {
		var td Takedown
		if json.Unmarshal(kv.Value, &td) != nil || td.RequestedBy != by || td.IdempotencyKey != key || td.RequestedMS < since {
			continue
		}
		if match == nil || td.RequestedMS > match.RequestedMS {
			match = &td
		}
	}
	if match != nil {
		td := *match
		if td.ContentID != content || td.Reason != reason {
			return Opened{}, fmt.Errorf("%w: key %q opened takedown %s of content %q (reason %q)", relaycore.ErrIdempotencyKeyReused, key, td.ID, td.ContentID, td.Reason)
		}
		// The holders' requests are rows of their own, delivered after the
		// record at times: answer them once all have arrived.
		if done, err := o.caughtUp(ctx, TakedownTarget(td.ID)); err != nil || !done {
			return Opened{}, errors.Join(fmt.Errorf("%w: takedown %s, opened with idempotency key %q", ErrNotYet, td.ID, key), err)
		}
		v, err := o.load(ctx, td.ID)
		if err != nil {
			return Opened{}, err
		}
		nodes := []string{}
		for _, r := range v.requests {
			if r.RequestedMS == td.RequestedMS {
				nodes = append(nodes, r.LateHolder)
			}
		}
		sort.Strings(nodes)
		o.log().Info("takedown request replayed", "takedown", td.ID, "content_id", content, "by", by, "idempotency_key", key)
		return Opened{Takedown: td, Holders: nodes, Replayed: true}, nil
	}
	if done, err := o.caughtUp(ctx, OpenTarget); err != nil || !done {
		return Opened{}, errors.Join(fmt.Errorf("%w: the takedown idempotency key %q opened", ErrNotYet, key), err)
	}
	return Opened{}, fmt.Errorf("%w: key %q opened a takedown that is closed since (takedowns.close_after is shorter than the key's lifetime): use a new key to open another", relaycore.ErrIdempotencyKeyReused, key)
}

// defaultIdempotencyTTL is relaycore's default idempotency TTL (24 h),
// for an Owner whose RelayHandler leaves it zero.
const defaultIdempotencyTTL = 24 * time.Hour

// replaySkew widens the window replay looks in by the clocks' skew
// between the owner that opened the takedown and the one replaying it.
const replaySkew = takedown.MaxClockSkew

// view is one takedown as its partition and the holder index show it.
type view struct {
	meta     Takedown
	requests map[string]relaycore.ContentTakedownV1 // by request id
	handoffs map[string]relaycore.TakedownHandoffV1
	ordered  map[string]Order
	receipts map[string][]byte   // the receipt line, by request id
	waivers  map[string][]Waiver // by node, oldest first
	holders  map[string]Holder   // the index, by node
}

func (o *Owner) load(ctx context.Context, id string) (*view, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	items, err := o.readAll(ctx, TakedownTarget(id), "")
	if err != nil {
		return nil, err
	}
	v := &view{requests: map[string]relaycore.ContentTakedownV1{}, handoffs: map[string]relaycore.TakedownHandoffV1{},
		ordered: map[string]Order{}, receipts: map[string][]byte{}, waivers: map[string][]Waiver{}, holders: map[string]Holder{}}
	corrupt := func(key string, err error) error {
		return fmt.Errorf("%w: takedown %s key %s: %v", relaycore.ErrCorruptRecord, id, key, err)
	}
	for _, it := range items {
		k := it.Key
		switch {
		case k == keyMeta:
			if err := json.Unmarshal(it.Value, &v.meta); err != nil || v.meta.V != 1 {
				return nil, corrupt(k, err)
			}
		case strings.HasPrefix(k, relaycore.TakedownHandoffPrefix):
			h, err := relaycore.DecodeTakedownHandoff(it.Value)
			if err != nil {
				return nil, corrupt(k, err)
			}
			v.handoffs[requestSuffix(h.Request)] = h
		case strings.HasPrefix(k, relaycore.TakedownPrefix):
			t, err := relaycore.DecodeTakedown(it.Value)
			if err != nil {
				return nil, corrupt(k, err)
			}
			v.requests[requestSuffix(t)] = t
		case strings.HasPrefix(k, orderedPfx):
			var ord Order
			if err := json.Unmarshal(it.Value, &ord); err != nil {
				return nil, corrupt(k, err)
			}
			v.ordered[ord.Request] = ord
		case strings.HasPrefix(k, receiptPfx):
			v.receipts[strings.TrimPrefix(k, receiptPfx)] = it.Value
		case strings.HasPrefix(k, waivePfx):
			var w Waiver
			if err := json.Unmarshal(it.Value, &w); err != nil {
				return nil, corrupt(k, err)
			}
			node, _, _ := strings.Cut(strings.TrimPrefix(k, waivePfx), "/")
			v.waivers[node] = append(v.waivers[node], w)
		}
	}
	for _, ws := range v.waivers {
		sort.SliceStable(ws, func(i, j int) bool { return ws[i].AtMS < ws[j].AtMS })
	}
	if v.meta.ID == "" {
		if done, err := o.caughtUp(ctx, TakedownTarget(id)); err != nil || !done {
			return nil, errors.Join(fmt.Errorf("%w: %q", ErrNotYet, id), err)
		}
		// Caught up now, but a fire may have delivered the record between
		// the read above and that check: only a record still absent after
		// it is none (else the owner would drop a live takedown from the
		// open list).
		if _, ok, err := o.getTarget(ctx, TakedownTarget(id), keyMeta); err != nil || ok {
			return nil, errors.Join(fmt.Errorf("%w: %q", ErrNotYet, id), err)
		}
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	hs, err := o.Holders(ctx, v.meta.ContentID)
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		v.holders[h.Node] = h
	}
	return v, nil
}

// latest is node's latest request in the takedown (ok false: none).
func (v *view) latest(node string) (relaycore.ContentTakedownV1, bool) {
	var (
		best relaycore.ContentTakedownV1
		ok   bool
	)
	for _, t := range v.requests {
		if t.LateHolder == node && (!ok || t.RequestedMS > best.RequestedMS) {
			best, ok = t, true
		}
	}
	return best, ok
}

// covers reports whether waiver w of node still releases it: the node has
// not reported holding the content since w (a later report), and w is not
// older than the node's latest request.
func (v *view) covers(node string, w Waiver) bool {
	if h, ok := v.holders[node]; ok && h.State == StateHeld && h.Seq > w.ReportSeq {
		return false
	}
	t, requested := v.latest(node)
	return !requested || w.AtMS >= t.RequestedMS
}

// covering is node's latest waiver that still releases it, if any.
func (v *view) covering(node string) (Waiver, bool) {
	ws := v.waivers[node]
	for i := len(ws) - 1; i >= 0; i-- {
		if v.covers(node, ws[i]) {
			return ws[i], true
		}
	}
	return Waiver{}, false
}

// saw reports whether one of node's waivers saw its report in the index
// now (or the index has none): that copy is released.
func (v *view) saw(node string) bool {
	h := v.holders[node]
	for _, w := range v.waivers[node] {
		if h.Seq <= w.ReportSeq {
			return true
		}
	}
	return false
}

// waiverOf is node's latest waiver, with the ones before it, for the
// status; nil if there is none.
func (v *view) waiverOf(node string) *Waiver {
	ws := v.waivers[node]
	if len(ws) == 0 {
		return nil
	}
	w := ws[len(ws)-1]
	w.Earlier = slices.Clone(ws[:len(ws)-1])
	return &w
}

// Waive records that node need not prove its eviction for takedown id: an
// operator's decision, with who (by) and why. Only a holder the takedown
// expects can be waived, and only if no waiver covers it already (a node
// waived before that reported the content again since may be waived
// anew; the new waiver keeps the earlier ones).
func (o *Owner) Waive(ctx context.Context, id, node, reason, by string) (Waiver, error) {
	if err := CheckNode(node); err != nil {
		return Waiver{}, err
	}
	if err := checkReason(reason); err != nil {
		return Waiver{}, err
	}
	v, err := o.load(ctx, id)
	if err != nil {
		return Waiver{}, err
	}
	if _, ok := v.covering(node); ok {
		return Waiver{}, fmt.Errorf("%w: %s in takedown %s", ErrWaived, node, id)
	}
	last, requested := v.latest(node)
	h, indexed := v.holders[node]
	if !requested && !(indexed && h.State == StateHeld) {
		return Waiver{}, fmt.Errorf("%w: %s is not a holder of takedown %s", ErrNotHolder, node, id)
	}
	w := Waiver{By: by, Reason: reason, AtMS: o.now().UnixMilli(), ReportSeq: h.Seq}
	val, _ := json.Marshal(w)
	// The idempotency key names what the waiver saw, so two operators (or
	// a retry) waiving the same state write one waiver, and a renewal,
	// which saw a later report or request, is a commit, and a key, of its
	// own: no waiver replaces another.
	seen := []string{id, node, strconv.FormatUint(h.Seq, 10)}
	if requested {
		seen = append(seen, requestSuffix(last))
	}
	key := idemKey("w", seen...)
	row := relaycore.Row{Target: TakedownTarget(id), Puts: []relaycore.KV{{Key: waivePfx + node + "/" + strings.TrimPrefix(key, "w:")[:32], Value: val}}}
	if _, err := o.enqueue(ctx, ControlSource, key, []relaycore.Row{row}); err != nil {
		if errors.Is(err, relaycore.ErrIdempotencyKeyReused) {
			return Waiver{}, fmt.Errorf("%w: %s in takedown %s", ErrWaived, node, id)
		}
		return Waiver{}, err
	}
	w.Earlier = slices.Clone(v.waivers[node])
	o.log().Info("takedown holder waived", "takedown", id, "node", node, "by", by, "reason", reason,
		"at_ms", w.AtMS, "report_seq", w.ReportSeq, "renews", len(w.Earlier))
	return w, nil
}
