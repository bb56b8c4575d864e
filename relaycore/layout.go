package relaycore

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Source partition keys (docs/layout.md describes every key and encoding).
// In key order: alarm < lease < os < r/... < rs, so the row pages form one
// contiguous range ["r/", "r0") and a scan from the start of the partition
// meets os before the first page. The keys only the engine addresses (the
// lease, the pages) are in relaycore/internal/layout.
const (
	KeyAlarm = "alarm" // durable alarm record, JSON {"due_ms":N}, written with Write.Due
	KeyOS    = "os"    // outbox state, JSON
	KeyRS    = "rs"    // scan cycle state, JSON
)

// ReservedPrefix starts the engine's own keys in target partitions (the rh
// watermarks). Relay rows may not write keys, and may not name targets,
// starting with it.
const ReservedPrefix = "_relay/"

const rhPrefix = ReservedPrefix + "rh/"

// maxKeyLen bounds a relay row key as the target store keeps it
// (Capabilities.KeyLen): DynamoDB's sort-key limit is 1024 bytes, and
// infra/dynamo widens non-ASCII bytes to two.
const maxKeyLen = 1024

// recentTags is how many of the latest enqueue batch tags os remembers so
// an ambiguous commit can be resolved even after its page was delivered.
const recentTags = 8

// RHKey is the target key holding source's watermark: the last seq of
// source applied to that target.
func RHKey(source Partition) string { return rhPrefix + string(source) }

// OutboxState is the os record. Version is bumped by every write so the
// enqueue guard (which compares the whole value) never suffers ABA.
type OutboxState struct {
	// NextSeq is the seq the next committed row gets (seqs start at 1).
	NextSeq uint64 `json:"next"`
	// Version counts os writes.
	Version uint64 `json:"ver"`
	// LastCommitMS is the commit time of the latest enqueue batch. Commit
	// times are made monotonic per source: commit_ms = max(now, last).
	LastCommitMS int64 `json:"last_ms"`
	// LeaseRequired is set by DeclareLeaseRequired (the seed's D34 ref shard).
	LeaseRequired bool `json:"lease_required,omitempty"`
	// Recent holds the tags of the latest enqueue batches, newest last.
	Recent []string `json:"recent,omitempty"`
	// Targets holds the enqueue-side counters of up to 32 targets, sorted
	// by hex name, in place of their t/<hex>/e records (fold.go).
	Targets []foldedEnq `json:"targets,omitempty"`
	// Clearing is set by the first step of an alarm clear made of single
	// writes (clearSingles): until a batch writes the alarm again, an
	// enqueue that keeps the alarm must rewrite it (same due time, a new
	// nonce) so that the clear's delete, guarded on the alarm's value,
	// fails. Every write of the alarm by an enqueue resets it.
	Clearing bool `json:"clr,omitempty"`
}

func emptyOS() OutboxState { return OutboxState{NextSeq: 1} }

func decodeOS(raw []byte, found bool) (OutboxState, error) {
	if !found {
		return emptyOS(), nil
	}
	var o OutboxState
	if err := json.Unmarshal(raw, &o); err != nil || o.NextSeq == 0 {
		return OutboxState{}, fmt.Errorf("%w: os %q", ErrCorruptRecord, raw)
	}
	return o, nil
}

func encodeJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings and integers are encoded here.
		panic(fmt.Sprintf("relaycore: encode %T: %v", v, err))
	}
	return b
}

// Claim is a fire's hold on a source: overlapping fires for one source see
// it and step aside instead of spending their budget on the same rows.
type Claim struct {
	Owner   string `json:"owner"`
	UntilMS int64  `json:"until_ms"`
}

// RelayState is the rs record: the source's scan cycle.
type RelayState struct {
	// Version counts rs writes (the checkpoint guard compares whole values).
	Version uint64 `json:"ver"`
	// CycleEnd is the last committed seq when the cycle started
	// (os.next-1); rows after it wait for the next cycle.
	CycleEnd uint64 `json:"cycle_end"`
	// Cursor is the last inspected seq. During an active cycle
	// (Cursor < CycleEnd) every undelivered row with seq <= Cursor has its
	// target in Blocked. Cursor == CycleEnd is the completed marker.
	Cursor uint64 `json:"cursor"`
	// From is the page key where the next scan starts (the page holding
	// seq Cursor+1, when it was written); empty means the head.
	From string `json:"from,omitempty"`
	// Blocked is the sorted set (at most MaxBlockedTargets) of targets whose
	// delivery failed in this cycle.
	Blocked []Partition `json:"blocked,omitempty"`
	// Idle counts consecutive fires that delivered nothing (for back-off).
	Idle int `json:"idle,omitempty"`
	// HeldFirst: the last fire that had both due held rows and outbox rows
	// served the held rows first; the next one lets the outbox go first.
	HeldFirst bool `json:"held_first,omitempty"`
	// Claim is the active fire's hold, if any.
	Claim *Claim `json:"claim,omitempty"`
	// Targets holds the delivery progress of up to 32 targets, sorted by
	// hex name, overriding those fields of their t/<hex>/s records
	// (fold.go).
	Targets []foldedDone `json:"targets,omitempty"`
	// Gone lists, ascending, the seqs of the outbox pages (their keys'
	// original first seqs) the last checkpoint took out of the outbox
	// without deleting them, on a store that deletes them loosely
	// afterwards (gone.go): until they are deleted they are ghosts, never
	// live pages.
	Gone []uint64 `json:"gone,omitempty"`
	// GoneHeld lists, ascending, the held pages (their keys after "u/")
	// the last checkpoint's redrives finished, taken out the same way.
	GoneHeld []string `json:"gone_held,omitempty"`
	// SweptMS is when idle targets were last looked for, SweepAfter where
	// the next look goes on in the t/ range (idle.go).
	SweptMS    int64  `json:"swept_ms,omitempty"`
	SweepAfter string `json:"sweep_after,omitempty"`
}

// Completed reports whether rs is the completed marker (or no cycle ran yet).
func (rs RelayState) Completed() bool { return rs.Cursor >= rs.CycleEnd }

// Blocked names are target partition names: any bytes. encoding/json would
// replace invalid UTF-8 with U+FFFD (a blocked target would then look healthy
// to the next fire, and its later rows would overtake an older one) and
// writes control bytes, <, > and & as six bytes each. So rs stores a name
// as itself when JSON keeps it byte for byte at its own length, and
// otherwise as blockedEscape followed by its unpadded base64url encoding.
// A literal name never contains blockedEscape (a control byte), so the two
// forms cannot be confused, and names written before this encoding decode
// as themselves.
const blockedEscape = "\x00"

// blockedNameMaxJSON bounds one encoded blocked name in rs: the escape
// (written by JSON as \u0000), base64 of MaxPartitionLen bytes, the quotes
// and a comma.
const blockedNameMaxJSON = len(`"\u0000",`) + (MaxPartitionLen*4+2)/3

func encodeBlockedName(t Partition) string {
	s := string(t)
	if !utf8.ValidString(s) {
		return blockedEscape + base64.RawURLEncoding.EncodeToString([]byte(s))
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c == '\u2028' || c == '\u2029' {
			return blockedEscape + base64.RawURLEncoding.EncodeToString([]byte(s))
		}
	}
	return s
}

func decodeBlockedName(s string) (Partition, error) {
	rest, ok := strings.CutPrefix(s, blockedEscape)
	if !ok {
		return Partition(s), nil
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", fmt.Errorf("blocked name %q: %w", s, err)
	}
	return Partition(b), nil
}

// MarshalJSON writes rs with its blocked names encoded losslessly (see
// blockedEscape).
func (rs RelayState) MarshalJSON() ([]byte, error) {
	type plain RelayState // no methods: no recursion
	p := plain(rs)
	if len(rs.Blocked) > 0 {
		p.Blocked = make([]Partition, len(rs.Blocked))
		for i, t := range rs.Blocked {
			p.Blocked[i] = Partition(encodeBlockedName(t))
		}
	}
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (rs *RelayState) UnmarshalJSON(raw []byte) error {
	type plain RelayState
	var p plain
	if err := json.Unmarshal(raw, &p); err != nil {
		return err
	}
	for i, t := range p.Blocked {
		name, err := decodeBlockedName(string(t))
		if err != nil {
			return err
		}
		p.Blocked[i] = name
	}
	*rs = RelayState(p)
	return nil
}

func decodeRS(raw []byte) (RelayState, error) {
	var rs RelayState
	if err := json.Unmarshal(raw, &rs); err != nil {
		return RelayState{}, fmt.Errorf("%w: rs %q", ErrCorruptRecord, raw)
	}
	return rs, nil
}

// AlarmRecord is the durable alarm: the source's fire is due at DueMS.
type AlarmRecord struct {
	DueMS int64 `json:"due_ms"`
	// Nonce (optional) makes a rewrite at the same due time a new value:
	// an enqueue that keeps the alarm during a clear (OutboxState.Clearing)
	// writes one so the clear's guarded delete fails.
	Nonce string `json:"n,omitempty"`
}

func decodeAlarm(raw []byte) (AlarmRecord, error) {
	var a AlarmRecord
	if err := json.Unmarshal(raw, &a); err != nil {
		return AlarmRecord{}, fmt.Errorf("%w: alarm %q", ErrCorruptRecord, raw)
	}
	return a, nil
}

func alarmWrite(dueMS int64) Write {
	if dueMS < 1 {
		dueMS = 1 // Write.Due == 0 means "not indexed"
	}
	return Write{Key: KeyAlarm, Value: encodeJSON(AlarmRecord{DueMS: dueMS}), Due: dueMS}
}

// alarmRewrite is the alarm at the same due time with a new value: what an
// enqueue keeping the alarm writes while os says a clear may be under way.
func alarmRewrite(dueMS int64, nonce string) Write {
	w := alarmWrite(dueMS)
	w.Value = encodeJSON(AlarmRecord{DueMS: w.Due, Nonce: nonce})
	return w
}

func encodeRH(seq uint64) []byte { return strconv.AppendUint(nil, seq, 10) }

func decodeRH(raw []byte, found bool) (uint64, error) {
	if !found {
		return 0, nil
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: rh %q", ErrCorruptRecord, raw)
	}
	return v, nil
}

func isPageKey(k string) bool { return strings.HasPrefix(k, layout.PagePrefix) }
