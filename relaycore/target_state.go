package relaycore

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// The per-target records' keys (q, t/, u/, v/, w/) are in
// relaycore/internal/layout, with the layout they make.

func targetHex(t Partition) string { return hex.EncodeToString([]byte(t)) }

// targetEnqKey is the enqueue-side record of target.
func targetEnqKey(t Partition) string { return layout.TargetPrefix + targetHex(t) + "/e" }

// targetStateKey is the delivery-state record of target.
func targetStateKey(t Partition) string { return layout.TargetPrefix + targetHex(t) + "/s" }

// heldPrefix is the key prefix of target's held pages.
func heldPrefix(t Partition) string { return layout.HeldPrefix + targetHex(t) + "/" }

// heldPageKey is the key of a held page; first is the page's original first
// seq, so key order is seq order within a target, as for outbox pages.
func heldPageKey(t Partition, first uint64) string {
	return heldPrefix(t) + fmt.Sprintf("%016x", first)
}

// retryKey is the marker that makes target's held rows due at dueMS.
func retryKey(dueMS int64, t Partition) string {
	return layout.RetryPrefix + fmt.Sprintf("%016x", uint64(max(dueMS, 0))) + "/" + targetHex(t)
}

func parseRetryKey(k string) (int64, Partition, error) {
	rest, ok := strings.CutPrefix(k, layout.RetryPrefix)
	due, th, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || len(due) != 16 {
		return 0, "", fmt.Errorf("%w: retry marker %q", ErrCorruptRecord, k)
	}
	var d uint64
	if _, err := fmt.Sscanf(due, "%016x", &d); err != nil {
		return 0, "", fmt.Errorf("%w: retry marker %q", ErrCorruptRecord, k)
	}
	t, err := hex.DecodeString(th)
	if err != nil || len(t) == 0 {
		return 0, "", fmt.Errorf("%w: retry marker %q", ErrCorruptRecord, k)
	}
	return int64(d), Partition(t), nil
}

// deadKey is an archive entry; id is the first skipped seq.
func deadKey(id uint64) string { return layout.DeadPrefix + fmt.Sprintf("%016x", id) }

// deadPageKey holds skipped rows of entry id as a page.
func deadPageKey(id, first uint64) string { return deadKey(id) + "/" + fmt.Sprintf("%016x", first) }

// TargetState is a target's delivery state as operators see it.
type TargetState string

const (
	// StateActive: the engine delivers the target's rows.
	StateActive TargetState = "active"
	// StateQuarantined: the target kept failing (or an operator said so);
	// its rows, existing and new, are held in order and nothing is tried
	// until an operator releases it.
	StateQuarantined TargetState = "quarantined"
	// StatePaused: an operator stopped delivery on purpose (maintenance);
	// rows are held in order, no failures are counted, until resumed.
	StatePaused TargetState = "paused"
)

// targetEnq is the t/<hex>/e record, written by enqueue batches only (they
// are serialized by the os guard, so it needs no guard of its own).
type targetEnq struct {
	// N counts the rows ever committed for the target.
	N uint64 `json:"n"`
	// Last and LastMS: the last committed seq and its commit time.
	Last   uint64 `json:"last"`
	LastMS int64  `json:"last_ms"`
	// Runs are the latest enqueue batches' runs of this target's rows
	// (contiguous seqs): [first, last, commit ms], oldest first, at most
	// maxEnqRuns. Dropped reports that older runs were dropped.
	Runs    [][3]int64 `json:"runs,omitempty"`
	Dropped bool       `json:"dropped,omitempty"`
}

// maxEnqRuns bounds targetEnq.Runs (the record stays well under 1 KB).
const maxEnqRuns = 8

func decodeTargetEnq(raw []byte, found bool) (targetEnq, error) {
	var e targetEnq
	if !found {
		return e, nil
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return e, fmt.Errorf("%w: target record %q", ErrCorruptRecord, raw)
	}
	return e, nil
}

func (e targetEnq) add(first, last uint64, commitMS int64) targetEnq {
	e.N += last - first + 1
	e.Last, e.LastMS = last, commitMS
	e.Runs = append(append([][3]int64(nil), e.Runs...), [3]int64{int64(first), int64(last), commitMS})
	if len(e.Runs) > maxEnqRuns {
		e.Runs = e.Runs[len(e.Runs)-maxEnqRuns:]
		e.Dropped = true
	}
	return e
}

// LastError is the latest delivery failure of a target.
type LastError struct {
	// Class: apply (the target store refused or failed), hook, too_large
	// (a row fits no target batch), read (rh could not be read).
	Class   string `json:"class"`
	Message string `json:"message"`
	AtMS    int64  `json:"at_ms"`
	// Seq is the first row of the failed attempt.
	Seq uint64 `json:"seq,omitempty"`
}

// Failure classes of LastError.Class.
const (
	ErrorClassApply    = "apply"     // the target store refused or failed the batch
	ErrorClassHook     = "hook"      // the RelayHook failed or its writes do not fit
	ErrorClassTooLarge = "too_large" // a row fits no batch of the target store
	ErrorClassRead     = "read"      // the target's rh could not be read
)

// maxErrorMessage bounds LastError.Message (bytes, cut at a rune boundary).
const maxErrorMessage = 256

// MaxReasonLen bounds an operator's reason; MaxActorLen who they are.
const (
	MaxReasonLen = 256
	MaxActorLen  = 64
)

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// OperatorNote records the last operator action on a target.
type OperatorNote struct {
	Action string `json:"action"`
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
	AtMS   int64  `json:"at_ms"`
}

// targetRec is the t/<hex>/s record, written by fire checkpoints and
// operator actions; both hold the source's claim while they read and write
// it, so it needs no guard of its own.
type targetRec struct {
	Target Partition   `json:"-"`
	State  TargetState `json:"state"`
	// SinceMS and every field after State are omitted when zero
	// (docs/layout.md); records written with "since_ms":0 or "done":0
	// still decode.
	SinceMS int64 `json:"since_ms,omitempty"`
	// Done counts the target's rows that left the outbox: delivered (or
	// found already delivered) and cleaned, or skipped into the archive.
	// Rows pending = targetEnq.N − Done.
	Done uint64 `json:"done,omitempty"`
	// Through is the target's rh as the last fire or operator knew it.
	Through uint64 `json:"through,omitempty"`
	// Next / NextMS: the first undelivered row the last fire saw in the
	// outbox (0 when it saw none).
	Next   uint64 `json:"next,omitempty"`
	NextMS int64  `json:"next_ms,omitempty"`
	// Held rows (not delivered, moved out of the outbox scan), their first
	// and last seq and the first one's commit time.
	Held      uint64 `json:"held,omitempty"`
	HeldFirst uint64 `json:"held_first,omitempty"`
	HeldLast  uint64 `json:"held_last,omitempty"`
	HeldMS    int64  `json:"held_ms,omitempty"`
	// RetryMS: when the held rows are due (a retry marker exists); 0 when
	// nothing is scheduled (quarantined, paused, or nothing held).
	RetryMS int64 `json:"retry_ms,omitempty"`
	// Released: an operator released or resumed the target and its held
	// rows have not all been delivered yet; a failure meanwhile sends a
	// released target straight back to quarantine.
	Released bool `json:"released,omitempty"`
	// FailedAttempts counts consecutive failed apply attempts; FailedRounds
	// consecutive delivery rounds (a fire's turn at the target) that failed.
	FailedAttempts int        `json:"failed_attempts,omitempty"`
	FailedRounds   int        `json:"failed_rounds,omitempty"`
	LastError      *LastError `json:"last_error,omitempty"`
	// Skipped counts rows skipped into the archive.
	Skipped uint64        `json:"skipped,omitempty"`
	Note    *OperatorNote `json:"note,omitempty"`
}

func decodeTargetRec(t Partition, raw []byte, found bool) (targetRec, error) {
	r := targetRec{Target: t, State: StateActive}
	if !found {
		return r, nil
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("%w: target state %q", ErrCorruptRecord, raw)
	}
	if !r.State.known() {
		return r, fmt.Errorf("%w: target state %q", ErrCorruptRecord, raw)
	}
	r.Target = t
	return r, nil
}

// known reports whether s is one of the three states: the one rule for
// target records and for ListTargets' filter.
func (s TargetState) known() bool {
	return s == StateActive || s == StateQuarantined || s == StatePaused
}

// holds reports whether the target's outbox rows must be moved aside when a
// scan meets them: it is quarantined or paused, or has held rows that are
// older than anything still in the outbox.
func (r targetRec) holds() bool { return r.State != StateActive || r.Held > 0 }

// HoldSummary is the q record as operators see it.
type HoldSummary holdSummary

// RetryMarker says a target's held rows are due at DueMS.
type RetryMarker struct {
	DueMS  int64
	Target Partition
}

// holdSummary is the q record: totals over the source's target records, kept
// in the same batches that change them. The lower bounds (OldestMS,
// MinSeq) are only reset when nothing is held, so they may be older than
// the truth, never newer.
type holdSummary struct {
	Version     uint64 `json:"ver"`
	HeldRows    uint64 `json:"held_rows,omitempty"`
	HeldTargets int    `json:"held_targets,omitempty"`
	Quarantined int    `json:"quarantined,omitempty"`
	Paused      int    `json:"paused,omitempty"`
	// Failing counts targets with a failed round not yet followed by a
	// delivery.
	Failing  int    `json:"failing,omitempty"`
	OldestMS int64  `json:"oldest_ms,omitempty"`
	MinSeq   uint64 `json:"min_seq,omitempty"`
	// Archived counts rows ever skipped into the archive.
	Archived uint64 `json:"archived,omitempty"`
}

func decodeHold(raw []byte, found bool) (holdSummary, error) {
	var q holdSummary
	if !found {
		return q, nil
	}
	if err := json.Unmarshal(raw, &q); err != nil {
		return q, fmt.Errorf("%w: hold summary %q", ErrCorruptRecord, raw)
	}
	return q, nil
}

// account moves q's totals from target record before to after.
func (q *holdSummary) account(before, after targetRec) {
	q.HeldRows += after.Held
	q.HeldRows -= min(q.HeldRows, before.Held)
	if before.Held > 0 {
		q.HeldTargets--
	}
	if after.Held > 0 {
		q.HeldTargets++
		if q.OldestMS == 0 || after.HeldMS < q.OldestMS {
			q.OldestMS = after.HeldMS
		}
		if q.MinSeq == 0 || after.HeldFirst < q.MinSeq {
			q.MinSeq = after.HeldFirst
		}
	}
	count := func(s TargetState, d int) {
		switch s {
		case StateQuarantined:
			q.Quarantined += d
		case StatePaused:
			q.Paused += d
		}
	}
	count(before.State, -1)
	count(after.State, 1)
	if before.FailedRounds > 0 {
		q.Failing--
	}
	if after.FailedRounds > 0 {
		q.Failing++
	}
	q.HeldTargets, q.Quarantined, q.Paused, q.Failing = max(q.HeldTargets, 0), max(q.Quarantined, 0), max(q.Paused, 0), max(q.Failing, 0)
	if q.HeldRows == 0 {
		q.OldestMS, q.MinSeq = 0, 0
	}
	q.Archived += after.Skipped - before.Skipped
}

// deadEntry is the w/<16 hex id> archive record; the rows follow it as pages.
type deadEntry struct {
	V         int        `json:"v"`
	Target    string     `json:"target"`
	TargetHex string     `json:"target_hex,omitempty"`
	First     uint64     `json:"first"`
	Last      uint64     `json:"last"`
	Rows      int        `json:"rows"`
	By        string     `json:"by,omitempty"`
	Reason    string     `json:"reason"`
	AtMS      int64      `json:"at_ms"`
	LastError *LastError `json:"last_error,omitempty"`
	// Requeued holds the seqs the rows got when re-enqueued (input order).
	Requeued []uint64 `json:"requeued,omitempty"`
}
