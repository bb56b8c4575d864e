package relaycore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Takedown requests ride the relay as ordinary rows, and TakedownRequestTimer
// turns each into a durable handoff at the target for the future takedown
// owner (the seed's WP-5.6a), which does not exist yet. Until it does,
// nothing may treat a takedown as done: the launch consumer retains the
// request and a timer, and never writes an acknowledgement or consumed state.
//
// How a row carries a request: a put of key takedownKey(req) (under
// TakedownPrefix) whose value is the request encoded by encodeTakedown.
// NewTakedownRow builds such a row. At the target the row's put retains the
// request itself; the hook adds, in the same target batch, the handoff record
// under takedownHandoffKey(req): the request and the owner's timer.

// TakedownPrefix starts the key of every row put that carries a takedown
// request: TakedownPrefix + content id + "/" + late holder + "/" + the
// request time as 19 decimal digits.
const TakedownPrefix = "takedown/"

// TakedownHandoffPrefix starts the handoff records TakedownRequestTimer adds
// (same suffix as the request's key). Only the hook writes them, and only the
// future takedown owner may consume them; relay rows that put or delete such
// a key are refused. The two prefixes' ranges are disjoint ('-' < '/').
const TakedownHandoffPrefix = "takedown-handoff/"

// Limits of a takedown request. The identifiers follow the edge agent's
// rule (edge/wire: segment ids up to 128 bytes, node ids up to 64, of
// [A-Za-z0-9._-] not starting with '.' or '-'), so a content id is a segment
// id and a late holder a node id, and neither can contain the key separator.
const (
	maxTakedownContentIDLen = 128
	maxTakedownHolderLen    = 64
	maxTakedownReasonLen    = 1024
	// maxTakedownMS (year 10000) keeps request time plus delay from
	// overflowing and the key's 19 digits fixed-width. It is typed int64:
	// as an untyped constant it would become an int in fmt calls, which
	// does not compile on 32-bit platforms.
	maxTakedownMS int64 = 253402300800000
	// maxTakedownDelay keeps TimerDueMS from overflowing.
	maxTakedownDelay = 100 * 365 * 24 * time.Hour
)

var takedownIDPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// ContentTakedownV1 is a real late-holder takedown request, retained until
// the future takedown owner consumes it: content ContentID was still held by
// node LateHolder when its takedown was requested at RequestedMS. Encoded as
// JSON, e.g.
//
//	{"v":1,"content_id":"seg-9f2c","late_holder":"edge-7","requested_ms":1800000000123,"reason":"dmca 2026-118"}
type ContentTakedownV1 struct {
	// Version is the record format, always 1.
	Version     int    `json:"v"`
	ContentID   string `json:"content_id"`
	LateHolder  string `json:"late_holder"`
	RequestedMS int64  `json:"requested_ms"`
	Reason      string `json:"reason"`
}

// Validate reports why t is not a well-formed version-1 request, or nil.
func (t ContentTakedownV1) Validate() error {
	why := ""
	switch {
	case t.Version != 1:
		why = fmt.Sprintf("version %d, want 1", t.Version)
	case !validTakedownID(t.ContentID, maxTakedownContentIDLen):
		why = fmt.Sprintf("content id %q must be 1..%d bytes of [A-Za-z0-9._-], not starting with '.' or '-'", t.ContentID, maxTakedownContentIDLen)
	case !validTakedownID(t.LateHolder, maxTakedownHolderLen):
		why = fmt.Sprintf("late holder %q must be 1..%d bytes of [A-Za-z0-9._-], not starting with '.' or '-'", t.LateHolder, maxTakedownHolderLen)
	case t.RequestedMS <= 0 || t.RequestedMS >= maxTakedownMS:
		why = fmt.Sprintf("requested_ms %d out of range (1..%d)", t.RequestedMS, maxTakedownMS-1)
	case t.Reason == "" || len(t.Reason) > maxTakedownReasonLen || !utf8.ValidString(t.Reason):
		why = fmt.Sprintf("reason must be 1..%d bytes of UTF-8", maxTakedownReasonLen)
	}
	if why != "" {
		return &TakedownError{Key: takedownKey(t), Reason: why}
	}
	return nil
}

func validTakedownID(id string, max int) bool {
	return len(id) >= 1 && len(id) <= max && takedownIDPattern.MatchString(id)
}

// takedownKey is the row key that carries t. It names the request fully
// (content, holder, request time), so the same request always lands on the
// same key and distinct requests never overwrite each other.
func takedownKey(t ContentTakedownV1) string { return TakedownPrefix + takedownSuffix(t) }

// takedownHandoffKey is the key of t's handoff record at the target.
func takedownHandoffKey(t ContentTakedownV1) string {
	return TakedownHandoffPrefix + takedownSuffix(t)
}

func takedownSuffix(t ContentTakedownV1) string {
	return fmt.Sprintf("%s/%s/%019d", t.ContentID, t.LateHolder, max(t.RequestedMS, 0))
}

// encodeTakedown validates t and encodes it.
func encodeTakedown(t ContentTakedownV1) ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return encodeJSON(t), nil
}

// DecodeTakedown decodes and validates a request: exactly one JSON object of
// the version-1 fields (unknown fields refused), nothing after it.
func DecodeTakedown(raw []byte) (ContentTakedownV1, error) {
	var t ContentTakedownV1
	if err := decodeStrictJSON(raw, &t); err != nil {
		return ContentTakedownV1{}, &TakedownError{Reason: "not a version-1 request: " + err.Error()}
	}
	return t, t.Validate()
}

func decodeStrictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

// NewTakedownRow builds the relay row that carries t to target.
func NewTakedownRow(target Partition, t ContentTakedownV1) (Row, error) {
	v, err := encodeTakedown(t)
	if err != nil {
		return Row{}, err
	}
	return Row{Target: target, Puts: []KV{{Key: takedownKey(t), Value: v}}}, nil
}

// TakedownHandoffV1 is the durable handoff TakedownRequestTimer leaves at the
// target for the future takedown owner: the request and the owner's timer.
// It has no acknowledgement or consumed state on purpose; the owner, when it
// exists, consumes the record. Encoded as JSON:
//
//	{"v":1,"request":{...ContentTakedownV1...},"timer_due_ms":1800086400123}
type TakedownHandoffV1 struct {
	Version int               `json:"v"`
	Request ContentTakedownV1 `json:"request"`
	// TimerDueMS is when the owner's timer is due: the request time plus
	// the hook's Delay. It is derived from the request alone, so redelivery
	// rewrites the same value and never resets the timer.
	TimerDueMS int64 `json:"timer_due_ms"`
}

// DecodeTakedownHandoff decodes and validates a handoff record.
func DecodeTakedownHandoff(raw []byte) (TakedownHandoffV1, error) {
	var h TakedownHandoffV1
	if err := decodeStrictJSON(raw, &h); err != nil {
		return TakedownHandoffV1{}, fmt.Errorf("%w: handoff: %v", ErrCorruptRecord, err)
	}
	if h.Version != 1 || h.TimerDueMS < h.Request.RequestedMS {
		return TakedownHandoffV1{}, fmt.Errorf("%w: handoff version %d, timer %d before request %d", ErrCorruptRecord, h.Version, h.TimerDueMS, h.Request.RequestedMS)
	}
	if err := h.Request.Validate(); err != nil {
		return TakedownHandoffV1{}, fmt.Errorf("%w: handoff: %w", ErrCorruptRecord, err)
	}
	return h, nil
}

// TakedownRequestTimer is a RelayHook that materializes a durable handoff
// for every takedown request a target batch applies, retaining request and
// timer for the future takedown owner (WP-5.6a). It never acknowledges a
// takedown merely because it ran: it only ever puts handoff records, never
// deletes one, never writes a consumed or acknowledged state, and refuses
// rows that would put or delete a handoff themselves.
//
// Each handoff is a pure function of its request (and Delay), so asking
// again for the same rows, after contention, a shrunk group or a crash,
// yields byte-identical writes; a request enqueued twice rewrites the same
// record with the same timer. A malformed request (undecodable, invalid, or
// under a key that does not name it) is an error: the target is blocked for
// the cycle and its rows stay queued. Deletes of request keys pass through
// and leave the handoff alone. The hook has no store or client.
type TakedownRequestTimer struct {
	// Delay is how long after the request the owner's timer is due. Zero:
	// at the request time, so the owner acts on it as soon as it runs.
	Delay time.Duration
}

// BeforeApply implements RelayHook.
func (h TakedownRequestTimer) BeforeApply(_ context.Context, req HookRequest) ([]Write, error) {
	if h.Delay < 0 || h.Delay > maxTakedownDelay {
		return nil, fmt.Errorf("takedown timer: delay %v out of range (0..%v)", h.Delay, maxTakedownDelay)
	}
	handoffs := map[string][]byte{}
	for _, r := range req.Rows {
		for _, k := range r.Deletes {
			if strings.HasPrefix(k, TakedownHandoffPrefix) {
				return nil, &TakedownError{Seq: r.Seq, Key: k, Reason: "a row may not delete a takedown handoff: only the future takedown owner consumes it"}
			}
		}
		for _, kv := range r.Puts {
			if strings.HasPrefix(kv.Key, TakedownHandoffPrefix) {
				return nil, &TakedownError{Seq: r.Seq, Key: kv.Key, Reason: "a row may not write a takedown handoff: the takedown timer hook writes them"}
			}
			if !strings.HasPrefix(kv.Key, TakedownPrefix) {
				continue
			}
			t, err := DecodeTakedown(kv.Value)
			if err != nil {
				var te *TakedownError
				if errors.As(err, &te) {
					return nil, &TakedownError{Seq: r.Seq, Key: kv.Key, Reason: te.Reason}
				}
				return nil, err
			}
			if want := takedownKey(t); kv.Key != want {
				return nil, &TakedownError{Seq: r.Seq, Key: kv.Key, Reason: fmt.Sprintf("the key does not name its request (want %q)", want)}
			}
			// A later row for the same key wins, like the row's own put.
			handoffs[takedownHandoffKey(t)] = encodeJSON(TakedownHandoffV1{Version: 1, Request: t, TimerDueMS: t.RequestedMS + h.Delay.Milliseconds()})
		}
	}
	out := make([]Write, 0, len(handoffs))
	for k, v := range handoffs {
		out = append(out, Write{Key: k, Value: v})
	}
	slices.SortFunc(out, func(a, b Write) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
