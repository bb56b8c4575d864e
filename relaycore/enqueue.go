package relaycore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// EnqueueConfig tunes enqueue planning and the deprecated
// CommitRelayRows and Requeue. RelayHandler.Enqueue builds one from the
// handler's fields. The zero value is usable. It goes with the deprecated
// calls that take it (CHANGELOG.md); new code sets the handler's fields
// instead.
type EnqueueConfig struct {
	// SkewMargin is subtracted from the lease expiry to get the deadline, so
	// a holder whose clock runs behind the lease's other contenders stops
	// writing before they may take over. Default 2s.
	SkewMargin time.Duration
	// PageBytes is the fill target of a row page, as the store's item size
	// (Capabilities.ItemSize, which never under-counts). Default 8192: a
	// full page bills at most 8 KB, and pages end close below that boundary
	// (compressed where the rows compress). A row too large for an empty page
	// gets a page of its own up to the store's item limit.
	PageBytes int
	// TargetCaps are the target store's limits, used to refuse rows that
	// could never be delivered. Zero: the same as the source store's.
	TargetCaps Capabilities
	// Kicker, if set, is kicked once after CommitRelayRows commits.
	Kicker Kicker
	// Logger receives kick failures. Nil discards.
	Logger *slog.Logger
	// MaxReplans bounds os races CommitRelayRows tolerates. Default 64.
	MaxReplans int
	// IdempotencyKey, when set (1..128 bytes of [A-Za-z0-9._:-]), makes
	// CommitRelayRows idempotent per source: the rows commit in one batch
	// with a record under IdemPrefix+key, and a later call with the same
	// key and the same rows while the record lives commits nothing and
	// returns the first call's seqs (CommitResult.Replayed). The same key
	// with other rows fails with ErrIdempotencyKeyReused. This is what
	// makes a client's retry after a lost response safe. Empty: off.
	IdempotencyKey string
	// IdempotencyTTL is how long the record answers retries, from the
	// commit time. Default 24h. Expired records are
	// overwritten by a new use of the key and collected by alarms.
	IdempotencyTTL time.Duration
}

const defaultPageBytes = 8 << 10

func (c EnqueueConfig) skew() time.Duration {
	if c.SkewMargin <= 0 {
		return 2 * time.Second
	}
	return c.SkewMargin
}

func (c EnqueueConfig) pageBytes(caps Capabilities) int {
	n := c.PageBytes
	if n <= 0 {
		n = defaultPageBytes
	}
	if caps.MaxItemBytes > 0 && n > caps.MaxItemBytes {
		n = caps.MaxItemBytes
	}
	return n
}

func (c EnqueueConfig) targetCaps(caps Capabilities) Capabilities {
	if c.TargetCaps == (Capabilities{}) {
		return caps
	}
	return c.TargetCaps
}

func (c EnqueueConfig) logger() *slog.Logger { return loggerOr(c.Logger) }

func loggerOr(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// RelayEnqueueSnapshot is what a chain is planned from: the source's os, the
// caller's lease (mandatory for a lease-required source) and the deadline,
// which already includes the skew margin.
//
// Deprecated: with ReadEnqueueSnapshot and EnqueueRelayRows.
type RelayEnqueueSnapshot struct {
	Source Partition
	OS     OutboxState
	Lease  *Lease
	// DeadlineMS is the last moment (unix ms, exclusive) a batch may be
	// sent; 0 in a hand-built snapshot means none.
	DeadlineMS int64
	NowMS      int64

	osRaw    []byte // os exactly as read (nil: absent or hand-built snapshot)
	osFound  bool
	leaseRaw []byte
	alarmRaw []byte // alarm exactly as read (nil: absent or hand-built snapshot)
	nonce    string
	// targets holds the enqueue-side record of every target the rows name
	// (ReadTargets), read after os, so the os guard also covers them.
	targets map[Partition]targetEnq
	// backingOff: the alarm is due later because the source backs off and
	// every target the rows name is one the back-off is for (readBackoff),
	// so the plan keeps the alarm instead of moving it to now.
	backingOff bool
}

// ReadTargets reads the enqueue-side record (t/<hex>/e) of every target
// rows name: each batch that commits rows for a target rewrites it with
// the new totals. Call it after ReadEnqueueSnapshot (CommitRelayRows does);
// the batches' os guard then covers these reads too, because every writer
// of the records also writes os.
func (s *RelayEnqueueSnapshot) ReadTargets(ctx context.Context, st Store, rows []Row) error {
	if s.targets == nil {
		s.targets = map[Partition]targetEnq{}
	}
	var todo []Partition
	for _, r := range rows {
		if _, ok := s.targets[r.Target]; ok || slices.Contains(todo, r.Target) {
			continue
		}
		if e, ok := s.OS.enqOf(r.Target); ok {
			s.targets[r.Target] = e // folded into os: no record to read
			continue
		}
		todo = append(todo, r.Target)
	}
	if err := s.readBackoff(ctx, st, rows); err != nil {
		return err
	}
	if len(todo) == 0 {
		return nil
	}
	// One batch read (one round trip on DynamoDB per 100 targets).
	keys := make([]string, len(todo))
	for i, t := range todo {
		keys[i] = targetEnqKey(t)
	}
	vals, err := GetMany(ctx, st, s.Source, keys)
	if err != nil {
		return fmt.Errorf("read target records %s: %w", s.Source, err)
	}
	for i, t := range todo {
		raw, found := vals[keys[i]]
		e, err := decodeTargetEnq(raw, found)
		if err != nil {
			return err
		}
		s.targets[t] = e
	}
	return nil
}

// readBackoff decides whether the enqueue of rows keeps a backed-off
// alarm (docs/engine.md, Enqueue step 3): when the alarm is due later than
// now, it reads rs once, and the alarm is kept when the last fire made no
// progress (rs.Idle > 0) and every target the rows name failed in the
// current cycle (rs.Blocked). Such rows could only be retried against the
// failing targets, so moving the alarm to now (and, with the fast kick,
// starting a fire at once) would retry a down target at the pace of its
// enqueues and quarantine it within seconds; kept, it is retried at the
// back-off the fire chose. A row for any other target moves the alarm to
// now, as before: a healthy target never waits for another's back-off.
// Any doubt (rs absent or unreadable) moves it. The alarm guard in the
// batch covers the decision: a fire that re-arms meanwhile fails the
// guard and the rows are re-planned on a fresh snapshot.
func (s *RelayEnqueueSnapshot) readBackoff(ctx context.Context, st Store, rows []Row) error {
	s.backingOff = false
	a, err := decodeAlarm(s.alarmRaw)
	if s.alarmRaw == nil || err != nil || a.DueMS <= s.NowMS {
		return nil
	}
	raw, found, err := st.Get(ctx, s.Source, KeyRS)
	if err != nil {
		return fmt.Errorf("read rs %s: %w", s.Source, err)
	}
	if !found {
		return nil
	}
	rs, err := decodeRS(raw)
	if err != nil || rs.Idle == 0 {
		return nil
	}
	for _, r := range rows {
		if _, ok := slices.BinarySearch(rs.Blocked, r.Target); !ok {
			return nil
		}
	}
	s.backingOff = true
	return nil
}

// targetEnqMaxBytes bounds an encoded targetEnq (maxEnqRuns runs of three
// numbers of at most 20 digits, and the scalar fields).
const targetEnqMaxBytes = 160 + maxEnqRuns*66

// ReadEnqueueSnapshot reads os (and the lease record when lease is non-nil)
// and computes the deadline: min(deadline, lease expiry − SkewMargin). A zero
// deadline means the caller sets none. It fails closed with
// ErrLeaseRequired, ErrStaleLease or ErrDeadlineExceeded.
//
// Deprecated: use RelayHandler.Enqueue (see EnqueueRelayRows).
func ReadEnqueueSnapshot(ctx context.Context, st Store, source Partition, lease *Lease, deadline time.Time, now time.Time, cfg EnqueueConfig) (RelayEnqueueSnapshot, error) {
	snap := RelayEnqueueSnapshot{Source: source, Lease: lease, NowMS: unixMS(now), DeadlineMS: math.MaxInt64}
	if !deadline.IsZero() {
		snap.DeadlineMS = unixMS(deadline)
	}
	// One scan reads alarm, lease and os (adjacent keys): on DynamoDB one
	// Query of under 4 KB, the price of reading os alone.
	head, err := scanRange(ctx, st, source, KeyAlarm, KeyOS+"\x00")
	if err != nil {
		return snap, fmt.Errorf("read os %s: %w", source, err)
	}
	raw, found := head[KeyOS]
	if snap.OS, err = decodeOS(raw, found); err != nil {
		return snap, err
	}
	snap.osRaw, snap.osFound = raw, found
	snap.alarmRaw = head[KeyAlarm]
	if lease == nil && snap.OS.LeaseRequired {
		return snap, fmt.Errorf("enqueue %s: %w", source, ErrLeaseRequired)
	}
	if lease != nil {
		var cur *Lease
		lraw, found := head[layout.KeyLease]
		if found {
			if cur, lraw, err = decodeLease(lraw); err != nil {
				return snap, err
			}
		}
		if cur == nil || *cur != *lease {
			return snap, fmt.Errorf("enqueue %s: %w", source, ErrStaleLease)
		}
		snap.leaseRaw = lraw
		snap.DeadlineMS = min(snap.DeadlineMS, lease.ExpiresMS-cfg.skew().Milliseconds())
	}
	if snap.NowMS >= snap.DeadlineMS {
		return snap, fmt.Errorf("enqueue %s: %w", source, ErrDeadlineExceeded)
	}
	snap.nonce = newNonce()
	return snap, nil
}

// scanRange reads every key in [start, end) of p, following pages.
func scanRange(ctx context.Context, st Store, p Partition, start, end string) (map[string][]byte, error) {
	out := map[string][]byte{}
	after := ""
	for {
		pg, err := st.Scan(ctx, p, ScanRequest{Start: start, End: end, After: after})
		if err != nil {
			return nil, err
		}
		for _, it := range pg.Items {
			out[it.Key] = it.Value
		}
		if pg.Next == "" {
			return out, nil
		}
		after = pg.Next
	}
}

func newNonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}

// maxTagLen bounds a batch tag: 12 hex nonce, '.', base-36 batch index.
const maxTagLen = 12 + 1 + 13

// SourceBatch is one planned link of an enqueue chain. Commit the links in
// order; each guards os on the previous link's os value.
//
// Deprecated: with ReadEnqueueSnapshot and EnqueueRelayRows.
type SourceBatch struct {
	Batch Batch
	// FirstSeq..LastSeq are the seqs this batch commits.
	FirstSeq, LastSeq uint64
	// Rows are the input row indices in seq order: Rows[i] gets FirstSeq+i.
	Rows []int
	// Tag is written into every page of the batch and into os.Recent.
	Tag string
	// FirstPageKey is the key of the batch's first page.
	FirstPageKey string
	CommitMS     int64
	DeadlineMS   int64
	// AlarmDueMS is when the durable alarm this batch writes or guards is
	// due: the enqueuer's clock, or an earlier due time the alarm already
	// held.
	AlarmDueMS int64
	// OSAfter is the os value this batch writes (the next link's guard).
	OSAfter []byte

	// armsAlarm: the batch writes the alarm (it was absent or due later,
	// or a clear was under way and it rewrote it),
	// rather than guarding a wake-up already due; the enqueue must kick.
	armsAlarm bool
	// backingOff: the batch guards a backed-off alarm it kept
	// (readBackoff); the enqueue does not kick.
	backingOff bool

	// idemKey and idemValue: the idempotency record this batch writes
	// (idempotent enqueue only), also evidence that an ambiguous commit
	// landed.
	idemKey   string
	idemValue []byte
}

// EnqueueRelayRows plans; it does not enqueue.
//
// Deprecated: use RelayHandler.Enqueue, which plans and commits. Planning
// alone (ReadEnqueueSnapshot, EnqueueRelayRows) has no caller outside the
// engine and is not offered from the next release (CHANGELOG.md).
func EnqueueRelayRows(snap RelayEnqueueSnapshot, rows []Row, caps Capabilities, cfg EnqueueConfig) ([]SourceBatch, error) {
	return planEnqueue(snap, rows, caps, cfg)
}

// planEnqueue validates rows and plans the chain of source batches that
// commits them (it writes nothing; RelayHandler.Enqueue commits them).
// Rows are grouped by target, stably, and each target's rows get
// contiguous seqs; the promised order is per
// (source, target), not across targets. Every batch carries the os guard and
// put, exactly one relay kick (the durable alarm due now by the snapshot's
// clock: put, or guarded unchanged when it is already due by then), the
// lease guard when a lease is held, and row pages, within caps.
func planEnqueue(snap RelayEnqueueSnapshot, rows []Row, caps Capabilities, cfg EnqueueConfig) ([]SourceBatch, error) {
	if snap.Lease == nil && snap.OS.LeaseRequired {
		return nil, fmt.Errorf("enqueue %s: %w", snap.Source, ErrLeaseRequired)
	}
	if err := validateRows(snap.Source, rows, caps, cfg); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if snap.NowMS >= snap.DeadlineMS && snap.DeadlineMS != 0 {
		return nil, fmt.Errorf("enqueue %s: %w", snap.Source, ErrDeadlineExceeded)
	}
	if snap.OS.NextSeq > math.MaxUint64-uint64(len(rows)) {
		// Seqs would wrap to ones earlier rows took: never reuse a seq.
		return nil, fmt.Errorf("enqueue %s: %w: os next seq %d leaves no room for %d rows", snap.Source, ErrCorruptRecord, snap.OS.NextSeq, len(rows))
	}
	nonce := snap.nonce
	if nonce == "" {
		nonce = newNonce()
	}
	pages := planPages(snap.Source, snap.OS.NextSeq, rows, caps, cfg)

	leasePre, fixedItems, fixedBytes := batchFixed(snap, caps)

	commitMS := max(snap.NowMS, snap.OS.LastCommitMS)
	prevOS := snap.OS
	prevGuard := osGuard(snap.osRaw, snap.osFound)
	if snap.osRaw == nil && snap.OS.Version > 0 {
		prevGuard = Precondition{Key: KeyOS, Value: encodeJSON(snap.OS)}
	}

	alarm := snap.alarmRaw
	// The wake-up is due now by the enqueuer's clock, not at the commit
	// time: commit times are monotonic per source, so one writer whose clock
	// ran ahead would otherwise push every later wake-up past the sweeper,
	// which only fires overdue alarms.
	dueMS := snap.NowMS
	if dueMS <= 0 { // hand-built snapshot without a clock reading
		dueMS = commitMS
	}
	enq := make(map[Partition]targetEnq, len(pages))
	for _, pg := range pages {
		if _, ok := enq[pg.target]; !ok {
			e, ok := snap.targets[pg.target]
			if !ok {
				return nil, fmt.Errorf("plan enqueue %s: the snapshot has no record of target %q (ReadTargets)", snap.Source, pg.target)
			}
			enq[pg.target] = e
		}
	}
	var out []SourceBatch
	for i := 0; i < len(pages); {
		j := batchEnd(snap.Source, pages, i, fixedItems, fixedBytes, caps)
		if j == i {
			return nil, fmt.Errorf("plan enqueue %s: a page does not fit one batch: %w", snap.Source, ErrBatchTooLarge)
		}
		tag := nonce + "." + strconv.FormatInt(int64(len(out)), 36)
		sb := SourceBatch{Tag: tag, CommitMS: commitMS, DeadlineMS: snap.DeadlineMS, FirstSeq: pages[i].first, FirstPageKey: layout.PageKey(pages[i].first)}
		next := prevOS
		next.NextSeq = pages[j-1].first + uint64(len(pages[j-1].rows))
		next.Version++
		next.LastCommitMS = commitMS
		next.Clearing = false // the batch writes the alarm, or finds no clear under way
		next.Recent = append(slices.Clone(prevOS.Recent), tag)
		if len(next.Recent) > recentTags {
			next.Recent = next.Recent[len(next.Recent)-recentTags:]
		}
		sb.LastSeq = next.NextSeq - 1
		sb.Batch.Preconditions = append(sb.Batch.Preconditions, prevGuard)
		if leasePre != nil {
			sb.Batch.Preconditions = append(sb.Batch.Preconditions, *leasePre)
		}
		sb.Batch.Writes = append(sb.Batch.Writes, Write{Key: KeyOS}) // its value once addPages folded the counters
		// The relay kick: the durable alarm due now. When the alarm is
		// already due by then (later links of a chain, an enqueue in the
		// same millisecond, a wake-up still pending), the batch keeps it
		// without rewriting or checking it: a wake-up at least as early, no
		// due-index churn, and a pending wake-up is never postponed (by a
		// writer whose clock runs ahead, say). The os guard covers it: every
		// delete of the alarm and every move of it past its writer's clock
		// writes os in the same batch (Alarm's clear and back-off re-arm,
		// osBump), so if the alarm goes or moves later meanwhile the guard
		// fails and the rows are re-planned. A check of the alarm would cost
		// a transactional item per batch (2 write units on DynamoDB) for
		// what the os guard already says.
		// A backed-off alarm whose back-off concerns every target of the
		// rows is kept the same way (readBackoff).
		// While os says an alarm clear of single writes may be under way
		// (Clearing), keeping the alarm means rewriting it at the same due
		// time: the clear's delete is guarded on the alarm's value, and so
		// fails (alarm.go, clearSingles).
		if a, err := decodeAlarm(alarm); alarm != nil && err == nil && (a.DueMS <= dueMS || snap.backingOff) {
			sb.AlarmDueMS, sb.backingOff = a.DueMS, a.DueMS > dueMS
			if prevOS.Clearing {
				alarm = sb.rewriteAlarm(a.DueMS, tag)
			}
		} else {
			aw := alarmWrite(dueMS)
			sb.Batch.Writes = append(sb.Batch.Writes, aw)
			alarm, sb.AlarmDueMS, sb.armsAlarm = aw.Value, aw.Due, true
		}
		sb.addPages(pages[i:j], enq, &next, caps)
		sb.OSAfter = encodeJSON(next)
		sb.Batch.Writes[0].Value = sb.OSAfter
		if err := caps.Check(snap.Source, sb.Batch); err != nil {
			return nil, fmt.Errorf("plan enqueue %s: %w", snap.Source, err)
		}
		out = append(out, sb)
		prevOS, prevGuard = next, Precondition{Key: KeyOS, Value: sb.OSAfter}
		i = j
	}
	return out, nil
}

// rewriteAlarm keeps the alarm due at dueMS by rewriting it (a new nonce,
// tag), as a batch does while os says a clear may be under way, and
// returns the value written. The alarm being kept is then one a fire is
// clearing: its wake-up is spent (that fire re-arms nothing), and a commit
// after the clear's last check re-creates the alarm with these rows under
// it and nobody on the way. So the batch kicks (KickSent), as if it armed
// the alarm.
func (sb *SourceBatch) rewriteAlarm(dueMS int64, tag string) []byte {
	aw := alarmRewrite(dueMS, tag)
	sb.Batch.Writes = append(sb.Batch.Writes, aw)
	sb.armsAlarm = true
	return aw.Value
}

// batchFixed is what every batch of an enqueue carries besides its pages:
// the lease guard (nil: no lease held), and the items and bytes of the os
// put and the alarm (at their largest).
func batchFixed(snap RelayEnqueueSnapshot, caps Capabilities) (*Precondition, int, int) {
	var leasePre *Precondition
	if snap.Lease != nil {
		lraw := snap.leaseRaw
		if lraw == nil {
			lraw = snap.Lease.encode()
		}
		leasePre = &Precondition{Key: layout.KeyLease, Value: lraw}
	}
	fixedItems := 2
	if leasePre != nil {
		fixedItems++
	}
	osMax := OutboxState{NextSeq: math.MaxUint64, Version: math.MaxUint64, LastCommitMS: math.MaxInt64, LeaseRequired: true, Clearing: true}
	for range recentTags {
		osMax.Recent = append(osMax.Recent, strings.Repeat("x", maxTagLen))
	}
	fixedBytes := caps.ItemSize(snap.Source, KeyOS, len(encodeJSON(osMax))+osFoldBytes(caps)) +
		caps.ItemSize(snap.Source, KeyAlarm, len(alarmRewrite(math.MaxInt64, strings.Repeat("x", maxTagLen)).Value))
	return leasePre, fixedItems, fixedBytes
}

// batchEnd is the end of the batch that starts at pages[i]: as many pages
// as fit beside the fixed items and bytes, each with its target's
// enqueue-side record (once per target). i: not even one fits.
func batchEnd(source Partition, pages []plannedPage, i, fixedItems, fixedBytes int, caps Capabilities) int {
	items, size := fixedItems, fixedBytes
	j := i
	inBatch := map[Partition]bool{}
	for j < len(pages) {
		s, n := caps.ItemSize(source, layout.PageKey(pages[j].first), pages[j].size), 1
		if t := pages[j].target; !inBatch[t] {
			// The batch rewrites the target's enqueue-side record.
			s, n = s+caps.ItemSize(source, targetEnqKey(t), targetEnqMaxBytes), 2
		}
		if (caps.MaxBatchItems > 0 && items+n > caps.MaxBatchItems) || (caps.MaxBatchBytes > 0 && size+s > caps.MaxBatchBytes) {
			break
		}
		inBatch[pages[j].target] = true
		items, size = items+n, size+s
		j++
	}
	return j
}

// addPages adds pages' writes and rows to sb, and the enqueue-side
// counters of each of their targets, updated in enq: folded into next (the
// os the batch writes) when there is room, else as its t/<hex>/e record.
func (sb *SourceBatch) addPages(pages []plannedPage, enq map[Partition]targetEnq, next *OutboxState, caps Capabilities) {
	var batchTargets []Partition
	runs := map[Partition][2]uint64{}
	for _, pg := range pages {
		sb.Batch.Writes = append(sb.Batch.Writes, Write{Key: layout.PageKey(pg.first), Value: assemblePage(pg.first, sb.CommitMS, sb.Tag, pg.target, pg.flags, pg.body)})
		sb.Rows = append(sb.Rows, pg.rows...)
		run, ok := runs[pg.target]
		if !ok {
			batchTargets = append(batchTargets, pg.target)
			run[0] = pg.first
		}
		run[1] = pg.first + uint64(len(pg.rows)) - 1
		runs[pg.target] = run
	}
	// A target's rows in one batch have contiguous seqs (one run).
	for _, t := range batchTargets {
		run := runs[t]
		enq[t] = enq[t].add(run[0], run[1], sb.CommitMS)
		if entries, ok := withEnq(next.Targets, t, enq[t], caps); ok {
			next.Targets = entries
			continue
		}
		sb.Batch.Writes = append(sb.Batch.Writes, Write{Key: targetEnqKey(t), Value: encodeJSON(enq[t])})
	}
}

type plannedPage struct {
	target Partition
	first  uint64
	rows   []int
	flags  byte   // page body flags (pageDeflate)
	body   []byte // encoded page body (row section, maybe compressed)
	size   int    // encoded page size bound: header at its widest (maxTagLen tag) + body
}

// planPages groups rows by target (stable), assigns contiguous seqs per
// target, and packs each target's rows into pages of at most the page
// budget (as the store's item size), compressed where that lets a page hold
// more rows (packPage).
func planPages(source Partition, seq uint64, rows []Row, caps Capabilities, cfg EnqueueConfig) []plannedPage {
	var order []Partition
	groups := map[Partition][]int{}
	for i, r := range rows {
		if _, ok := groups[r.Target]; !ok {
			order = append(order, r.Target)
		}
		groups[r.Target] = append(groups[r.Target], i)
	}
	codec := codecFor(caps)
	var pages []plannedPage
	for _, t := range order {
		idx := groups[t]
		for len(idx) > 0 {
			pg := packPage(&codec, source, t, seq, rows, idx, caps, cfg.pageBytes(caps))
			pages = append(pages, pg)
			seq += uint64(len(pg.rows))
			idx = idx[len(pg.rows):]
		}
	}
	return pages
}

// packPage cuts the next page from idx (row indices of one target, in seq
// order): the longest prefix whose encoded page fits limit, found among the
// prefixes that
//   - with full keys and no compression (rowEncodedLen) fit the store's item
//     limit, so any later rewrite of the page's remaining rows fits too, and
//   - have a row section of at most maxPageRawBytes, and
//   - have keys summing to at most maxPageKeyBytes (what a decoder accepts).
//
// The longest prefix that fits uncompressed is a lower bound; when the next
// row does not fit uncompressed, the page is grown by compressing candidate
// prefixes (an estimate from the compression ratio, then bisection), so a
// page ends close below the budget — a KB boundary by default — wherever
// the data compresses. A first row that fits nowhere gets a page of its own
// (validation guarantees it fits the item limit).
func packPage(codec *pageCodec, source, target Partition, first uint64, rows []Row, idx []int, caps Capabilities, limit int) plannedPage {
	hdr := pageHeaderMax(strings.Repeat("x", maxTagLen), target)
	itemSize := func(bodyLen int) int { return caps.ItemSize(source, layout.PageKey(first), hdr+bodyLen) }
	itemLimit := pageItemLimit(source, target, caps)
	// Longest prefix within the rewrite and raw-section bounds (maxN), and
	// within limit uncompressed (n0).
	n0, maxN := 0, 0
	full, raw, keys, prev := 0, 0, 0, ""
	for maxN < len(idx) {
		r := rows[idx[maxN]]
		l, last := rowSectionLen(r, prev)
		f, kb := full+rowEncodedLen(r), keys+rowKeyBytes(r)
		if maxN > 0 && (itemSize(f) > itemLimit || uvarintLen(uint64(maxN+1))+raw+l > maxPageRawBytes || kb > maxPageKeyBytes) {
			break
		}
		full, raw, keys, prev = f, raw+l, kb, last
		maxN++
		if maxN == 1 || itemSize(uvarintLen(uint64(maxN))+raw) <= limit {
			n0 = maxN
		}
	}
	sub := func(n int) []Row {
		out := make([]Row, n)
		for i := range out {
			out[i] = rows[idx[i]]
		}
		return out
	}
	best := plannedPage{target: target, first: first, rows: idx[:n0]}
	best.flags, best.body = codec.body(sub(n0))
	if n0 < maxN && !codec.plain {
		// Grow: lo fits, hi (when known) does not.
		lo, hi, hiKnown := n0, maxN+1, false
		for probes := 0; hi-lo > 1 && probes < 24; probes++ {
			n := (lo + hi) / 2
			if !hiKnown {
				// Estimate from lo's compression ratio, at least one more row.
				n = min(maxN, max(lo+1, lo*(limit-itemSize(0))/max(1, len(best.body))))
			}
			flags, body := codec.body(sub(n))
			if itemSize(len(body)) <= limit {
				lo, best.rows, best.flags, best.body = n, idx[:n], flags, body
				if n == maxN {
					break
				}
				continue
			}
			if flags == 0 && lo == n0 {
				break // the next row does not fit and the data does not compress
			}
			hi, hiKnown = n, true
		}
	}
	best.size = hdr + len(best.body)
	return best
}

// pageItemLimit bounds a page's rewrite size (its rows with full keys,
// uncompressed, as the store's item size): the store's item limit, and the
// room a fire's checkpoint has beside rs, because the fire that collects a
// page reserves that size in its checkpoint in case it must rewrite the
// page's remaining rows. A page beyond it could never be collected and
// would stall its source for good.
func pageItemLimit(source, target Partition, caps Capabilities) int {
	limit := math.MaxInt
	if caps.MaxItemBytes > 0 {
		// The page may be moved aside under its target's (longer) held key.
		limit = caps.MaxItemBytes - (caps.ItemSize(source, heldPageKey(target, 0), 0) - caps.ItemSize(source, layout.PageKey(0), 0))
	}
	if caps.MaxBatchBytes > 0 {
		limit = min(limit, caps.MaxBatchBytes-CheckpointReserve(source, caps))
	}
	return limit
}

// validateRows refuses rows that could never be committed or delivered.
func validateRows(source Partition, rows []Row, caps Capabilities, cfg EnqueueConfig) error {
	tc := cfg.targetCaps(caps)
	for i, r := range rows {
		if reason := rowProblem(source, r, caps, tc); reason != "" {
			return &RowError{Index: i, Reason: reason}
		}
	}
	return nil
}

func rowProblem(source Partition, r Row, caps, tc Capabilities) string {
	if reason := TargetNameProblem(string(r.Target)); reason != "" {
		return "target name " + reason
	}
	switch {
	case r.Target == source:
		return "target is the source itself"
	case len(r.Puts) == 0 && len(r.Deletes) == 0:
		return "no puts and no deletes"
	}
	seen := make(map[string]bool, len(r.Puts)+len(r.Deletes))
	rowBytes := tc.ItemSize(r.Target, RHKey(source), 20)
	check := func(k string, put bool) string {
		switch {
		case k == "":
			return "empty key"
		case tc.KeyLen(k) > maxKeyLen:
			return fmt.Sprintf("key of %d bytes as stored by the target store, limit %d", tc.KeyLen(k), maxKeyLen)
		case strings.HasPrefix(k, ReservedPrefix):
			return fmt.Sprintf("key %q uses the reserved prefix %q", k, ReservedPrefix)
		}
		if wasPut, dup := seen[k]; dup {
			if wasPut != put {
				return fmt.Sprintf("key %q is both put and deleted", k)
			}
			return fmt.Sprintf("duplicate key %q", k)
		}
		seen[k] = put
		return ""
	}
	for _, kv := range r.Puts {
		if p := check(kv.Key, true); p != "" {
			return p
		}
		s := tc.ItemSize(r.Target, kv.Key, len(kv.Value))
		if tc.MaxItemBytes > 0 && s > tc.MaxItemBytes {
			return fmt.Sprintf("value of key %q is %d bytes as a target item, limit %d", kv.Key, s, tc.MaxItemBytes)
		}
		rowBytes += s
	}
	for _, k := range r.Deletes {
		if p := check(k, false); p != "" {
			return p
		}
		rowBytes += tc.ItemSize(r.Target, k, 0)
	}
	if tc.MaxBatchItems > 0 && len(seen) > tc.MaxBatchItems-2 {
		return fmt.Sprintf("%d keys, limit %d (one target batch with rh and one hook write)", len(seen), tc.MaxBatchItems-2)
	}
	if tc.MaxBatchBytes > 0 && rowBytes > tc.MaxBatchBytes {
		return fmt.Sprintf("row is %d bytes as a target batch, limit %d", rowBytes, tc.MaxBatchBytes)
	}
	if kb := rowKeyBytes(r); kb > maxPageKeyBytes {
		return fmt.Sprintf("keys sum to %d bytes, page limit %d", kb, maxPageKeyBytes)
	}
	ps := caps.ItemSize(source, layout.PageKey(0), pageHeaderMax(strings.Repeat("x", maxTagLen), r.Target)+rowEncodedLen(r))
	if limit := pageItemLimit(source, r.Target, caps); ps > limit {
		return fmt.Sprintf("row needs a %d-byte page, source limit %d (its item limit, and room beside rs in a fire's checkpoint)", ps, limit)
	}
	return ""
}

// CommitResult reports a commit. On error, the rows with a non-zero seq in
// Seqs were committed (and will be delivered); the others were not, except
// when the error wraps ErrCommitUnknown: then the rows of the batch being
// committed may or may not be in the outbox.
type CommitResult struct {
	// Seqs holds the seq of each input row, in input order (0: not committed).
	Seqs []uint64
	// Batches is the number of source batches committed.
	Batches int
	// Replans counts os races lost (each re-planned only the uncommitted rows).
	Replans int
	// AlarmDueMS is when the durable alarm the last batch wrote or guarded
	// is due (the fast-path kick's due time). 0 on a replay.
	AlarmDueMS int64
	// Replayed means an earlier call with the same IdempotencyKey and the
	// same rows had committed them: Seqs are that call's, and this call
	// wrote nothing.
	Replayed bool
	// Kick is what the commit did about waking the source's fire (see
	// KickDecision); KickNone without a Kicker, on a replay or when
	// nothing committed.
	Kick KickDecision

	armed      bool // a committed batch wrote the alarm
	backingOff bool // the last committed batch kept a backed-off alarm
}

// KickDecision is what an enqueue did about waking its source's fire after
// it committed. It kicks only when no wake-up is on its way: the commit
// reads the alarm record anyway, so a source that is already draining
// costs no kick (with the fast kick, no Lambda invoke) per enqueue.
type KickDecision uint8

const (
	// KickNone: no kick was considered (no Kicker, a replay, nothing
	// committed).
	KickNone KickDecision = iota
	// KickSent: the commit armed the alarm (it was absent, or due later:
	// a back-off for other targets or a held row's retry), or found it overdue by more than
	// kickGrace with no fire holding the source's claim (the wake-up asked
	// for is late or lost), and kicked.
	KickSent
	// KickPending: the alarm was already due, and fell due less than
	// kickGrace ago: whoever armed it kicked then, and that fire is on its
	// way.
	KickPending
	// KickClaimed: the alarm was overdue but a fire holds the source's
	// claim; that fire re-arms the alarm and kicks when it ends, and the
	// guard on the alarm record made sure it sees these rows.
	KickClaimed
	// KickBackoff: the alarm is due later, a back-off after a fire that
	// made no progress, and every row went to a target that failed in the
	// current cycle: the commit kept the alarm (a down target is retried
	// at the back-off's pace, not at its enqueues'), and the fire that
	// armed it kicked for that time.
	KickBackoff
)

// String names the decision as the api function's logs do.
func (d KickDecision) String() string {
	switch d {
	case KickSent:
		return "sent"
	case KickPending:
		return "pending"
	case KickClaimed:
		return "claimed"
	case KickBackoff:
		return "backoff"
	default:
		return "none"
	}
}

// kickGrace is how long after an alarm fell due an enqueue trusts the kick
// that armed it: an async invoke normally starts the fire, which claims
// the source, well within it. Past it, an unclaimed overdue alarm is
// kicked again (a Scheduler re-arm's schedule may run up to a minute
// late); kicks for one due time collapse in every Kicker.
const kickGrace = 2 * time.Second

// kickDecision decides whether the commit in res must kick: see
// KickDecision. It reads rs only for an alarm overdue past kickGrace.
// Any doubt (rs unreadable) kicks: a kick is cheap, a missed one costs up
// to the sweep's minute.
func kickDecision(ctx context.Context, st Store, clock Clock, source Partition, res CommitResult) KickDecision {
	if res.armed {
		return KickSent
	}
	if res.backingOff {
		return KickBackoff
	}
	now := unixMS(clock.Now())
	if now-res.AlarmDueMS < kickGrace.Milliseconds() {
		return KickPending
	}
	raw, found, err := st.Get(ctx, source, KeyRS)
	if err != nil || !found {
		return KickSent
	}
	rs, err := decodeRS(raw)
	if err != nil {
		return KickSent
	}
	// An operator action's claim lasts a few store calls and re-arms
	// nothing: only a fire's claim means a fire will re-arm.
	if c := rs.Claim; c != nil && c.UntilMS > now && !strings.HasPrefix(c.Owner, opTokenPrefix) {
		return KickClaimed
	}
	return KickSent
}

// CommitRelayRows validates, plans and commits rows to source's outbox,
// with lease (required for a lease-required source; nil otherwise) and
// deadline (zero: none), as RelayHandler.Enqueue does.
//
// Deprecated: use RelayHandler.Enqueue, which takes the store, clock,
// kicker, logger and target capabilities from the handler, wired once.
// CommitRelayRows stays for one release (CHANGELOG.md).
func CommitRelayRows(ctx context.Context, st Store, clock Clock, source Partition, lease *Lease, deadline time.Time, rows []Row, cfg EnqueueConfig) (res CommitResult, err error) {
	return commitRelayRows(ctx, st, clock, source, lease, deadline, rows, cfg)
}

// commitRelayRows commits the chain in order; after an os race it re-reads
// os and re-plans only the uncommitted rows; an ambiguous store error is
// resolved by re-reading os (and the batch's tag), so no seq is reused or
// lost. A stale lease or passed deadline fails closed. After anything
// committed it kicks cfg.Kicker once, best effort, unless a wake-up is
// already on its way (kickDecision).
func commitRelayRows(ctx context.Context, st Store, clock Clock, source Partition, lease *Lease, deadline time.Time, rows []Row, cfg EnqueueConfig) (res CommitResult, err error) {
	res.Seqs = make([]uint64, len(rows))
	if reason := SourceIDProblem(string(source)); reason != "" {
		shown := string(source)
		if len(shown) > 64 {
			shown = shown[:64] + "…"
		}
		return res, fmt.Errorf("%w: source %q %s", ErrInvalidSourceID, shown, reason)
	}
	if len(rows) == 0 {
		return res, nil
	}
	defer func() {
		if res.Batches == 0 || cfg.Kicker == nil {
			return
		}
		if res.Kick = kickDecision(ctx, st, clock, source, res); res.Kick != KickSent {
			return
		}
		if kerr := kickBounded(ctx, cfg.Kicker, source, res.AlarmDueMS); kerr != nil {
			cfg.logger().Warn("relay kick failed; the durable alarm still holds", "source", string(source), "due_ms", res.AlarmDueMS, "err", kerr)
		}
	}()
	if cfg.IdempotencyKey != "" {
		if err := ValidIdempotencyKey(cfg.IdempotencyKey); err != nil {
			return res, fmt.Errorf("enqueue %s: %w", source, err)
		}
	}
	caps := st.Capabilities()
	if err := validateRows(source, rows, caps, cfg); err != nil {
		return res, err
	}
	if cfg.IdempotencyKey != "" {
		err := commitIdempotent(ctx, st, clock, source, lease, deadline, rows, cfg, &res)
		return res, err
	}
	maxReplans := cfg.MaxReplans
	if maxReplans <= 0 {
		maxReplans = 64
	}
	pending := make([]int, len(rows))
	for i := range pending {
		pending[i] = i
	}
	for {
		snap, err := ReadEnqueueSnapshot(ctx, st, source, lease, deadline, clock.Now(), cfg)
		if err != nil {
			return res, err
		}
		sub := make([]Row, len(pending))
		for i, ri := range pending {
			sub[i] = rows[ri]
		}
		if err := snap.ReadTargets(ctx, st, sub); err != nil {
			return res, err
		}
		plan, err := planEnqueue(snap, sub, caps, cfg)
		if err != nil {
			return res, err
		}
		lost := false
		for _, b := range plan {
			landed, err := commitBatch(ctx, st, clock, source, b)
			if err != nil {
				return res, err
			}
			if !landed {
				lost = true
				break
			}
			for k, si := range b.Rows {
				res.Seqs[pending[si]] = b.FirstSeq + uint64(k)
			}
			res.Batches++
			res.AlarmDueMS = b.AlarmDueMS
			res.armed = res.armed || b.armsAlarm
			res.backingOff = b.backingOff
		}
		if !lost {
			return res, nil
		}
		res.Replans++
		if res.Replans > maxReplans {
			return res, fmt.Errorf("commit relay rows %s: %w", source, ErrContention)
		}
		pending = slices.DeleteFunc(pending, func(ri int) bool { return res.Seqs[ri] != 0 })
	}
}

// commitBatch applies one link. It reports landed == false when another
// writer won the os race (the caller re-plans).
func commitBatch(ctx context.Context, st Store, clock Clock, source Partition, b SourceBatch) (bool, error) {
	for attempt := 0; ; attempt++ {
		if unixMS(clock.Now()) >= b.DeadlineMS {
			return false, fmt.Errorf("commit relay rows %s seq %d: %w", source, b.FirstSeq, ErrDeadlineExceeded)
		}
		err := st.Apply(ctx, source, b.Batch)
		if err == nil {
			return true, nil
		}
		if i, ok := FailedPrecondition(err); ok {
			if b.Batch.Preconditions[i].Key == layout.KeyLease {
				return false, fmt.Errorf("commit relay rows %s: %w", source, ErrStaleLease)
			}
			if b.idemKey != "" && b.Batch.Preconditions[i].Key == b.idemKey {
				return false, errIdemTaken
			}
			return false, nil
		}
		if !MayBeApplied(err) {
			return false, fmt.Errorf("commit relay rows %s seq %d: %w", source, b.FirstSeq, err)
		}
		// Reads are always safe to retry; resolving is worth a few tries
		// because the alternative is an unknown outcome for the caller.
		outcome, rerr := resolveCommit(ctx, st, source, b)
		for try := 1; rerr != nil && try < resolveAttempts && ctx.Err() == nil; try++ {
			outcome, rerr = resolveCommit(ctx, st, source, b)
		}
		switch {
		case rerr != nil:
			// The batch may have landed: its rows must not be reported as
			// uncommitted (a caller retrying them would commit them twice).
			return false, fmt.Errorf("commit relay rows %s seq %d: %w: %v; resolving it failed: %w", source, b.FirstSeq, ErrCommitUnknown, err, rerr)
		case outcome == commitLanded:
			return true, nil
		case outcome == commitLost:
			return false, nil
		case outcome == commitUnknown:
			return false, fmt.Errorf("commit relay rows %s seq %d: %w (%v)", source, b.FirstSeq, ErrCommitUnknown, err)
		}
		if attempt >= 8 {
			return false, fmt.Errorf("commit relay rows %s seq %d: %w", source, b.FirstSeq, err)
		}
		// commitNotApplied with os unchanged: resending the same guarded
		// batch is safe.
	}
}

type commitOutcome int

// resolveAttempts bounds the re-reads that resolve one ambiguous batch.
const resolveAttempts = 3

const (
	commitNotApplied commitOutcome = iota // os unchanged: resend
	commitLanded
	commitLost // another writer's batch took these seqs
	commitUnknown
)

// resolveCommit decides what happened to an ambiguous enqueue batch.
func resolveCommit(ctx context.Context, st Store, source Partition, b SourceBatch) (commitOutcome, error) {
	if b.idemKey != "" {
		// The record carries the batch's seqs and commit time; another
		// batch writes this exact value only for the same rows, seqs and
		// commit time under the same key, which is the same outcome.
		raw, found, err := st.Get(ctx, source, b.idemKey)
		if err != nil {
			return commitUnknown, err
		}
		if found && bytes.Equal(raw, b.idemValue) {
			return commitLanded, nil
		}
	}
	raw, found, err := st.Get(ctx, source, KeyOS)
	if err != nil {
		return commitUnknown, err
	}
	if found && bytes.Equal(raw, b.OSAfter) {
		return commitLanded, nil
	}
	guard := b.Batch.Preconditions[0]
	if b.idemKey != "" {
		guard = b.Batch.Preconditions[1] // after the idempotency guard
	}
	if (guard.Absent && !found) || (!guard.Absent && found && bytes.Equal(raw, guard.Value)) {
		return commitNotApplied, nil
	}
	cur, err := decodeOS(raw, found)
	if err != nil {
		return commitUnknown, err
	}
	if slices.Contains(cur.Recent, b.Tag) {
		return commitLanded, nil
	}
	if praw, ok, err := st.Get(ctx, source, b.FirstPageKey); err != nil {
		return commitUnknown, err
	} else if ok {
		if pg, err := decodePage(b.FirstPageKey, praw); err == nil && pg.Tag == b.Tag {
			return commitLanded, nil
		}
		return commitLost, nil
	}
	var guardVersion uint64
	if !guard.Absent {
		g, err := decodeOS(guard.Value, true)
		if err != nil {
			return commitUnknown, err
		}
		guardVersion = g.Version
	}
	// Had the batch landed it would be os write guardVersion+1, and at most
	// recentTags-1 writes later its tag would still be in Recent.
	if cur.Version <= guardVersion+recentTags {
		return commitLost, nil
	}
	return commitUnknown, nil
}
