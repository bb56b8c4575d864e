package sim

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// checker holds the model and checks the invariants. It reads the raw
// stores directly (never through the gate) after every store call that
// may have changed them, so each check sees exactly one more step.
type checker struct {
	s            *simulation
	src          map[relaycore.Partition]*srcShadow
	tgt          map[relaycore.Partition]*tgtShadow
	sourceChecks int
	// reserve: rsReserve of each source under the source store's
	// capabilities, which stay the same for the run.
	reserve map[relaycore.Partition]int
}

// srcShadow is what the checker knows about one source.
type srcShadow struct {
	view relaycore.SourceView
	rows map[uint64]relaycore.Row // rows in the outbox now
	// reg is every row ever committed, by seq: the ground truth the target
	// model is built from. A seq never leaves reg.
	reg    map[uint64]*regRow
	byCall map[[2]int][]uint64 // (actor id, call) -> seqs it committed
	// skipped: seqs an operator skipped into the archive (never applied).
	skipped map[uint64]bool
	// heldSince: targets quarantined or paused, with the store call that
	// made them so; fires started later must not apply their rows until
	// release or resume.
	heldSince map[relaycore.Partition]int
	// inspector reads the source after each step, decoding only the items
	// that step changed (quiescence reads it afresh with InspectSource).
	inspector relaycore.SourceInspector
	// requeued: rows committed by requeues of each archive entry, and the
	// seqs the first requeue that answered returned.
	requeuedRows map[uint64]int
	requeued     map[uint64][]uint64
}

type regRow struct {
	row         relaycore.Row
	actor, call int
}

// tgtShadow is what the checker knows about one target.
type tgtShadow struct {
	items map[string][]byte              // raw state after the last step
	rh    map[relaycore.Partition]uint64 // per source
	model map[string][]byte              // expected user and hook keys
}

func newChecker(s *simulation) *checker {
	c := &checker{s: s, src: map[relaycore.Partition]*srcShadow{}, tgt: map[relaycore.Partition]*tgtShadow{}, reserve: map[relaycore.Partition]int{}}
	for _, p := range s.sc.Sources {
		c.src[p] = &srcShadow{rows: map[uint64]relaycore.Row{}, reg: map[uint64]*regRow{}, byCall: map[[2]int][]uint64{},
			skipped: map[uint64]bool{}, heldSince: map[relaycore.Partition]int{},
			requeuedRows: map[uint64]int{}, requeued: map[uint64][]uint64{}}
	}
	for _, t := range s.sc.Targets {
		c.tgt[t] = &tgtShadow{items: map[string][]byte{}, rh: map[relaycore.Partition]uint64{}, model: map[string][]byte{}}
	}
	return c
}

// start reads the (empty) stores.
func (c *checker) start() error {
	for _, p := range c.s.sc.Sources {
		v, err := relaycore.InspectSource(c.s.ctx, c.s.raw.Source, p)
		if err != nil {
			return err
		}
		if len(v.Pages) > 0 || v.RS != nil {
			return fmt.Errorf("source %s is not empty", p)
		}
		c.src[p].view = v
	}
	for _, t := range c.s.sc.Targets {
		items, err := c.scanAll(c.s.raw.Target, t)
		if err != nil {
			return err
		}
		if len(items) > 0 {
			return fmt.Errorf("target %s is not empty", t)
		}
	}
	return nil
}

func (c *checker) scanAll(st relaycore.Store, p relaycore.Partition) (map[string][]byte, error) {
	out := map[string][]byte{}
	after := ""
	for {
		pg, err := st.Scan(c.s.ctx, p, relaycore.ScanRequest{After: after})
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", p, err)
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

func sortedSeqs(m map[uint64]relaycore.Row) []uint64 {
	return slices.Sorted(maps.Keys(m))
}

func sameRow(a, b relaycore.Row) bool {
	if a.Target != b.Target || len(a.Puts) != len(b.Puts) || !slices.Equal(a.Deletes, b.Deletes) {
		return false
	}
	for i := range a.Puts {
		if a.Puts[i].Key != b.Puts[i].Key || !bytes.Equal(a.Puts[i].Value, b.Puts[i].Value) {
			return false
		}
	}
	return true
}

// afterSource checks a source partition after a step that may have
// changed it: no row changed, vanished before its target's rh covered it,
// or reappeared; new rows take exactly the next seqs, under the lease and
// before the deadline; commit times are monotonic; rs keeps the
// blocked-set invariant; a non-empty outbox has its durable alarm; the
// queries agree with the outbox.
func (c *checker) afterSource(a *actor, req *request) {
	s := c.s
	p := req.p
	sh := c.src[p]
	if sh == nil {
		s.violate("apply to unknown source partition %s", p)
		return
	}
	view, err := sh.inspector.Inspect(s.ctx, s.raw.Source, p)
	if err != nil {
		s.violate("inspect source %s: %v", p, err)
		return
	}
	cur := map[uint64]relaycore.Row{}
	prevKey := ""
	for _, pg := range view.Pages {
		if pg.Key <= prevKey || pg.Key > layout.PageKey(pg.First) {
			s.violate("source %s: page %s (first seq %d) is out of order or keyed above its first seq", p, pg.Key, pg.First)
		}
		prevKey = pg.Key
		for _, r := range pg.Rows {
			if _, dup := cur[r.Seq]; dup {
				s.violate("source %s: seq %d is in two pages", p, r.Seq)
			}
			cur[r.Seq] = r
		}
	}
	// A target is held from the call whose batch made it quarantined or
	// paused (an operator's, or a fire's automatic quarantine) until one
	// makes it active again: read from the store, so an actor that
	// crashed after its batch landed is counted too.
	for _, ts := range view.Targets {
		_, was := sh.heldSince[ts.Target]
		switch {
		case ts.State != relaycore.StateActive && !was:
			sh.heldSince[ts.Target] = s.res.Calls
		case ts.State == relaycore.StateActive && was:
			delete(sh.heldSince, ts.Target)
		}
	}
	outbox := maps.Clone(cur)
	for _, pg := range view.Held {
		for _, r := range pg.Rows {
			if _, dup := cur[r.Seq]; dup {
				s.violate("source %s: seq %d is in two pages (held page %s)", p, r.Seq, pg.Key)
			}
			cur[r.Seq] = r
		}
	}
	if len(view.Other) > 0 {
		s.violate("source %s: keys the engine does not own: %v", p, view.Other)
	}

	// The archive only grows, holds exactly the skipped rows unchanged,
	// and a row is skipped only while undelivered.
	archived := map[uint64]relaycore.Row{}
	for _, e := range view.Archive {
		for _, r := range e.Rows {
			archived[r.Seq] = r
		}
	}
	for seq := range sh.skipped {
		if _, ok := archived[seq]; !ok {
			s.violate("source %s: skipped row %d left the archive", p, seq)
		}
	}
	// Rows that left the outbox must be covered by their target's rh, or
	// be in the archive (skipped).
	for _, seq := range sortedSeqs(sh.rows) {
		row := sh.rows[seq]
		if nr, ok := cur[seq]; ok {
			if !sameRow(row, nr) {
				s.violate("source %s: row %d changed in the outbox: %s -> %s", p, seq, fmtRow(row), fmtRow(nr))
			}
			continue
		}
		if ar, ok := archived[seq]; ok {
			if !sameRow(row, ar) {
				s.violate("source %s: row %d archived changed: %s -> %s", p, seq, fmtRow(row), fmtRow(ar))
			}
			if rh := c.tgt[row.Target].rh[p]; rh >= seq {
				s.violate("source %s: row %d skipped into the archive although %s's rh %d covers it (it was applied)", p, seq, row.Target, rh)
			}
			sh.skipped[seq] = true
			continue
		}
		rh, err := relaycore.TargetWatermark(s.ctx, s.raw.Target, row.Target, p)
		if err != nil {
			s.violate("read rh %s/%s: %v", row.Target, p, err)
		} else if rh < seq {
			s.violate("source %s: row %d for %s left the outbox while the target's rh is %d (deleted before delivery)", p, seq, row.Target, rh)
		}
	}

	// New rows: exactly seqs oldNext..newNext-1, committed by this call.
	oldOS, newOS := sh.view.OS, view.OS
	if newOS.NextSeq < oldOS.NextSeq {
		s.violate("source %s: os.next went back from %d to %d", p, oldOS.NextSeq, newOS.NextSeq)
	}
	var added []uint64
	for _, seq := range sortedSeqs(cur) {
		if _, ok := sh.rows[seq]; ok {
			continue
		}
		if old := sh.reg[seq]; old != nil {
			s.violate("source %s: seq %d reappeared in the outbox (reused or resurrected): was %s, now %s", p, seq, fmtRow(old.row), fmtRow(cur[seq]))
			continue
		}
		added = append(added, seq)
	}
	for seq := oldOS.NextSeq; seq < newOS.NextSeq; seq++ {
		if !slices.Contains(added, seq) {
			s.violate("source %s: os.next moved %d -> %d but seq %d was not written (lost seq)", p, oldOS.NextSeq, newOS.NextSeq, seq)
			break
		}
	}
	for _, seq := range added {
		r := cur[seq]
		if seq < oldOS.NextSeq || seq >= newOS.NextSeq {
			s.violate("source %s: new row seq %d outside os.next %d -> %d", p, seq, oldOS.NextSeq, newOS.NextSeq)
		}
		if r.CommitMS < oldOS.LastCommitMS || r.CommitMS != newOS.LastCommitMS {
			s.violate("source %s: row %d commit time %d not monotonic (previous %d, os now %d)", p, seq, r.CommitMS, oldOS.LastCommitMS, newOS.LastCommitMS)
		}
		sh.reg[seq] = &regRow{row: r, actor: a.id, call: a.call}
		if a.requeueID != 0 {
			sh.requeuedRows[a.requeueID]++
			s.res.Requeued++
		}
		k := [2]int{a.id, a.call}
		sh.byCall[k] = append(sh.byCall[k], seq)
		s.res.Committed++
	}
	if len(added) > 0 {
		c.checkEnqueuer(a, req, sh)
	}
	if id := a.requeueID; id != 0 && len(added) > 0 {
		for _, e := range view.Archive {
			if e.ID == id && sh.requeuedRows[id] > len(e.Rows) {
				s.violate("source %s: requeues of archive entry %d committed %d rows, the entry holds %d (a retry enqueued them again)", p, id, sh.requeuedRows[id], len(e.Rows))
			}
		}
	}

	c.checkCheckpoint(req)
	c.checkRS(p, view, outbox)
	c.checkHeld(p, view, outbox)
	// Rows held for a quarantined or paused target wait for an operator,
	// not for an alarm; the outbox and held rows with a retry marker do.
	if (len(view.Pages) > 0 || len(view.Retries) > 0) && view.Alarm == nil {
		s.violate("source %s: %d rows in the outbox and %d retry markers but no durable alarm (lost wake-up)", p, len(view.Pages), len(view.Retries))
	}
	sh.view, sh.rows = view, cur
	c.sourceChecks++
	if n := s.cfg.QueryEvery; n <= 1 || c.sourceChecks%n == 0 {
		c.checkQueries(p, false)
	}
}

// checkCheckpoint checks a fire checkpoint that cleaned up pages: its
// page writes (deletes and rewrites of partly delivered pages) leave room
// for the largest rs within the source's batch-byte limit, so the
// checkpoint fits whatever the blocked set holds. It also counts it (see
// Result.Checkpoints).
func (c *checker) checkCheckpoint(req *request) {
	s := c.s
	b := req.batch
	if len(b.Preconditions) != 1 || b.Preconditions[0].Key != relaycore.KeyRS || b.Preconditions[0].Absent || len(b.Writes) < 2 {
		return
	}
	caps := s.raw.Source.Capabilities()
	rewrites, pageBytes := 0, 0
	for _, w := range b.Writes {
		if !strings.HasPrefix(w.Key, layout.PagePrefix) {
			continue
		}
		if !w.Delete {
			rewrites++
		}
		pageBytes += caps.ItemSize(req.p, w.Key, len(w.Value))
	}
	s.res.Checkpoints++
	reserve, ok := c.reserve[req.p]
	if !ok {
		reserve = rsReserve(caps, req.p)
		c.reserve[req.p] = reserve
	}
	room := caps.MaxBatchBytes - reserve
	if caps.MaxBatchBytes > 0 && pageBytes > room {
		s.violate("source %s: checkpoint writes %d bytes of pages (%d rewritten), more than the %d bytes its batch limit %d leaves beside the largest rs",
			req.p, pageBytes, rewrites, room, caps.MaxBatchBytes)
	}
	if rewrites < 2 {
		return
	}
	s.res.Rewrites++
	if caps.MaxBatchBytes > 0 && 2*pageBytes >= room {
		s.res.NearLimit++
	}
}

// checkEnqueuer checks who committed new rows: a writer, holding the
// current lease when the source is lease-required, before its deadline as
// its own clock read it when it sent the batch.
func (c *checker) checkEnqueuer(a *actor, req *request, sh *srcShadow) {
	s := c.s
	if a.kind != kindWriter && a.kind != kindLeaseWriter && (a.kind != kindOperator || a.requeueID == 0) {
		s.violate("source %s: rows committed by %s, which is not a writer", req.p, a.name)
		return
	}
	if sh.view.OS.LeaseRequired {
		guarded := slices.ContainsFunc(req.batch.Preconditions, func(pc relaycore.Precondition) bool { return pc.Key == layout.KeyLease })
		switch {
		case a.lease == nil || !guarded:
			s.violate("source %s is lease-required but %s committed rows without a lease guard", req.p, a.name)
		case sh.view.Lease == nil || *sh.view.Lease != *a.lease:
			s.violate("source %s: %s committed under lease %+v but the record was %+v (stale lease)", req.p, a.name, *a.lease, sh.view.Lease)
		}
	}
	deadline := int64(1<<63 - 1)
	if a.deadline != 0 {
		deadline = a.deadline
	}
	if a.lease != nil {
		deadline = min(deadline, a.lease.ExpiresMS-s.sc.SkewMargin.Milliseconds())
	}
	if seen := a.resumedAt + a.skewMS; seen >= deadline {
		s.violate("source %s: %s sent an enqueue batch at %d by its clock, at or after its deadline %d", req.p, a.name, seen, deadline)
	}
}

// requeueReturned checks what a requeue of archive entry e answered: one
// seq per archived row, each holding that row (same target and writes),
// and the same seqs every time the entry is requeued.
func (c *checker) requeueReturned(src relaycore.Partition, e relaycore.ArchiveEntry, seqs []uint64) {
	s, sh := c.s, c.src[src]
	if len(seqs) != len(e.Rows) {
		s.violate("source %s: requeue of archive entry %d returned %d seqs for %d rows", src, e.ID, len(seqs), len(e.Rows))
		return
	}
	for i, seq := range seqs {
		if reg := sh.reg[seq]; reg == nil || !sameRow(reg.row, e.Rows[i]) {
			s.violate("source %s: requeue of archive entry %d returned seq %d for row %s, which holds %v", src, e.ID, seq, fmtRow(e.Rows[i]), reg)
		}
	}
	if first, ok := sh.requeued[e.ID]; ok && !slices.Equal(first, seqs) {
		s.violate("source %s: requeue of archive entry %d returned seqs %v, an earlier one %v", src, e.ID, seqs, first)
	} else if !ok {
		sh.requeued[e.ID] = slices.Clone(seqs)
	}
}

// checkRS checks the scan cycle: cursor <= cycle_end <= last seq; the
// blocked set is sorted, unique and at most MaxBlockedTargets; during an
// active cycle every undelivered row with seq <= cursor has its target
// blocked.
func (c *checker) checkRS(p relaycore.Partition, view relaycore.SourceView, cur map[uint64]relaycore.Row) {
	s := c.s
	rs := view.RS
	if rs == nil {
		return
	}
	if rs.Cursor > rs.CycleEnd || rs.CycleEnd > view.OS.NextSeq-1 {
		s.violate("source %s: rs cursor %d, cycle_end %d, os.next %d out of order", p, rs.Cursor, rs.CycleEnd, view.OS.NextSeq)
	}
	if len(rs.Blocked) > relaycore.MaxBlockedTargets {
		s.violate("source %s: %d blocked targets, limit %d", p, len(rs.Blocked), relaycore.MaxBlockedTargets)
	}
	if len(rs.Blocked) == relaycore.MaxBlockedTargets {
		s.res.BlockedFull++
	}
	for i := 1; i < len(rs.Blocked); i++ {
		if rs.Blocked[i-1] >= rs.Blocked[i] {
			s.violate("source %s: blocked set %v not sorted and unique", p, rs.Blocked)
			break
		}
	}
	if rs.Cursor >= rs.CycleEnd {
		return // completed marker: exempt
	}
	for _, seq := range sortedSeqs(cur) {
		if seq > rs.Cursor {
			break
		}
		row := cur[seq]
		if seq <= c.tgt[row.Target].rh[p] {
			continue // delivered, cleanup pending
		}
		if !slices.Contains(rs.Blocked, row.Target) {
			s.violate("source %s: active cycle (cursor %d < cycle_end %d) passed undelivered row %d for %s, which is not blocked (blocked %v)",
				p, rs.Cursor, rs.CycleEnd, seq, row.Target, rs.Blocked)
			return
		}
	}
}

// checkHeld checks the held rows against the outbox and the records: a
// target's undelivered held rows are all older than its undelivered rows
// in the outbox (so redriving them first keeps seq order); each target
// record counts exactly its held pages' rows; a target has a retry marker
// exactly when it is active with held rows, at the record's time; and the
// hold summary totals the records.
func (c *checker) checkHeld(p relaycore.Partition, view relaycore.SourceView, outbox map[uint64]relaycore.Row) {
	s := c.s
	rh := func(t relaycore.Partition) uint64 { return c.tgt[t].rh[p] }
	minOutbox := map[relaycore.Partition]uint64{}
	for seq, r := range outbox {
		if seq > rh(r.Target) && (minOutbox[r.Target] == 0 || seq < minOutbox[r.Target]) {
			minOutbox[r.Target] = seq
		}
	}
	heldRows := map[relaycore.Partition]uint64{}
	for _, pg := range view.Held {
		for _, r := range pg.Rows {
			heldRows[r.Target]++
			if m := minOutbox[r.Target]; r.Seq > rh(r.Target) && m != 0 && r.Seq > m {
				s.violate("source %s: held row %d of %s is newer than its outbox row %d (redrive would break seq order)", p, r.Seq, r.Target, m)
				return
			}
		}
	}
	markers := map[relaycore.Partition]int64{}
	for _, m := range view.Retries {
		if _, dup := markers[m.Target]; dup {
			s.violate("source %s: two retry markers for %s", p, m.Target)
		}
		markers[m.Target] = m.DueMS
	}
	var q relaycore.HoldSummary
	for _, t := range view.Targets {
		if t.Held != heldRows[t.Target] {
			s.violate("source %s: target %s record holds %d rows, its held pages %d", p, t.Target, t.Held, heldRows[t.Target])
		}
		due, has := markers[t.Target]
		want := t.State == relaycore.StateActive && t.Held > 0
		if has != want || (has && due != t.RetryMS) {
			s.violate("source %s: target %s (%s, %d held, retry %d) has marker %v at %d", p, t.Target, t.State, t.Held, t.RetryMS, has, due)
		}
		q.HeldRows += t.Held
		if t.Held > 0 {
			q.HeldTargets++
		}
		switch t.State {
		case relaycore.StateQuarantined:
			q.Quarantined++
		case relaycore.StatePaused:
			q.Paused++
		}
	}
	for t := range heldRows {
		if !slices.ContainsFunc(view.Targets, func(s relaycore.TargetStatus) bool { return s.Target == t }) {
			s.violate("source %s: held rows of %s without a target record", p, t)
		}
	}
	h := view.Hold
	if h.HeldRows != q.HeldRows || h.HeldTargets != q.HeldTargets || h.Quarantined != q.Quarantined || h.Paused != q.Paused {
		s.violate("source %s: hold summary %+v, records total %+v", p, h, q)
	}
}

// checkQueries compares SourceRelayState, RelayWatermark and
// RelayDeliveredThrough, read from the raw store, with the outbox.
// ghostStored reports whether an outbox page that rs lists as gone is still
// in the source store.
func (c *checker) ghostStored(p relaycore.Partition, rs *relaycore.RelayState) bool {
	if rs == nil || len(rs.Gone) == 0 {
		return false
	}
	keys := make([]string, len(rs.Gone))
	for i, seq := range rs.Gone {
		keys[i] = layout.PageKey(seq)
	}
	vals, err := relaycore.GetMany(c.s.ctx, c.s.raw.Source, p, keys)
	if err != nil {
		c.s.violate("read ghosts of %s: %v", p, err)
		return false
	}
	return len(vals) > 0
}

func (c *checker) checkQueries(p relaycore.Partition, all bool) {
	s := c.s
	sh := c.src[p]
	now := time.UnixMilli(s.now)
	st, err := relaycore.SourceRelayState(s.ctx, s.raw.Source, p, now)
	if err != nil {
		s.violate("source relay state %s: %v", p, err)
		return
	}
	seqs := sortedSeqs(sh.rows)
	var first uint64
	lower := sh.view.OS.LastCommitMS
	if len(seqs) > 0 {
		first = seqs[0]
		for _, q := range seqs {
			lower = min(lower, sh.rows[q].CommitMS)
		}
	}
	lower = min(lower, s.now)
	// While rows are held (quarantined, paused or retried targets) the
	// hold summary keeps lower bounds of their seqs and commit times: the
	// answers may then be early (smaller), never late.
	held := st.HeldRows > 0
	exact := st.FirstUndelivered == first && st.LowerBoundMS == lower
	bounded := held && st.FirstUndelivered <= first && st.FirstUndelivered > 0 && st.LowerBoundMS <= lower
	// Ghosts still stored (outbox pages rs.gone lists, not yet deleted
	// loosely) may make the answers early too, empty included: never late.
	ghost := c.ghostStored(p, sh.view.RS)
	ghostly := ghost && st.FirstUndelivered > 0 && (first == 0 || st.FirstUndelivered <= first) && st.LowerBoundMS <= lower
	emptyOK := st.Empty == (len(seqs) == 0) || (ghost && !st.Empty)
	if !emptyOK || st.NextSeq != sh.view.OS.NextSeq || !(exact || bounded || ghostly) {
		s.violate("source %s: SourceRelayState %+v, model empty=%v next=%d first=%d lower=%d", p, st, len(seqs) == 0, sh.view.OS.NextSeq, first, lower)
	}
	check := func(seq uint64) {
		got, err := relaycore.RelayDeliveredThrough(s.ctx, s.raw.Source, p, seq)
		want := seq < sh.view.OS.NextSeq && (first == 0 || first > seq)
		if err != nil || got != want && !((held || ghost) && want && !got && seq >= st.FirstUndelivered) {
			s.violate("source %s: RelayDeliveredThrough(%d) = %v, %v; model %v", p, seq, got, err, want)
		}
	}
	if !all {
		if n := sh.view.OS.NextSeq; n > 1 {
			check(1 + uint64(s.rng.Int64N(int64(n))))
		}
		return
	}
	wm, err := relaycore.RelayWatermark(s.ctx, s.raw.Source, p, now)
	if err != nil || wm != lower && !(held && wm <= lower) {
		s.violate("source %s: RelayWatermark = %d, %v; model %d", p, wm, err, lower)
	}
	for seq := uint64(1); seq <= sh.view.OS.NextSeq; seq++ {
		check(seq)
	}
}

// afterTarget checks a target partition after a step that may have changed
// it: at most one source's rh moved, only forward, not beyond that
// source's committed rows; the batch was guarded on the old rh and wrote
// exactly the rows (old, new] coalesced in seq order; and every key equals
// the model, which applies each source's rows up to rh in seq order.
func (c *checker) afterTarget(a *actor, req *request) {
	s := c.s
	t := req.p
	sh := c.tgt[t]
	if sh == nil {
		s.violate("apply to unknown target partition %s", t)
		return
	}
	items, err := c.scanAll(s.raw.Target, t)
	if err != nil {
		s.violate("%v", err)
		return
	}
	rh := map[relaycore.Partition]uint64{}
	for k, v := range items {
		if src, ok := strings.CutPrefix(k, relaycore.RHKey("")); ok {
			n, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil {
				s.violate("target %s: rh %s = %q", t, src, v)
			}
			rh[relaycore.Partition(src)] = n
		}
	}
	var moved []relaycore.Partition
	for _, src := range slices.Sorted(maps.Keys(rh)) {
		old, now := sh.rh[src], rh[src]
		switch {
		case now < old:
			s.violate("target %s: rh for %s went back from %d to %d", t, src, old, now)
		case now > old:
			moved = append(moved, src)
		}
	}
	for src := range sh.rh {
		if _, ok := rh[src]; !ok {
			s.violate("target %s: rh for %s vanished", t, src)
		}
	}
	if len(moved) > 1 {
		s.violate("target %s: one batch moved rh of several sources %v", t, moved)
	}
	for _, src := range moved {
		c.applyModel(a, req, t, src, sh.rh[src], rh[src])
	}
	sh.rh = rh
	for _, k := range slices.Sorted(maps.Keys(items)) {
		if strings.HasPrefix(k, relaycore.ReservedPrefix) {
			continue
		}
		if want, ok := sh.model[k]; !ok || !bytes.Equal(want, items[k]) {
			s.violate("target %s: key %s = %q, model %s (rh %v)", t, k, clip(items[k], 40), fmtModel(want, ok), rh)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(sh.model)) {
		if _, ok := items[k]; !ok {
			s.violate("target %s: key %s missing, model %q (rh %v)", t, k, clip(sh.model[k], 40), rh)
		}
	}
	sh.items = items
}

func fmtModel(v []byte, ok bool) string {
	if !ok {
		return "absent"
	}
	return strconv.Quote(clip(v, 40))
}

// applyModel advances target t's model by source src's rows (old, new]
// and checks the batch that did it.
func (c *checker) applyModel(a *actor, req *request, t, src relaycore.Partition, old, now uint64) {
	s := c.s
	ss := c.src[src]
	if ss == nil {
		s.violate("target %s: rh for unknown source %s", t, src)
		return
	}
	var maxReg uint64
	for seq := range ss.reg {
		maxReg = max(maxReg, seq)
	}
	if now > maxReg {
		s.violate("target %s: rh for %s moved to %d beyond the last committed seq %d", t, src, now, maxReg)
	}
	var rows []relaycore.Row
	for seq := old + 1; seq <= now; seq++ {
		if r := ss.reg[seq]; r != nil && r.row.Target == t && !ss.skipped[seq] {
			rows = append(rows, r.row)
		}
	}
	if since, ok := ss.heldSince[t]; ok && a != nil && a.startCall > since && len(rows) > 0 {
		s.violate("target %s: %s applied rows of %s (seqs %d..%d) although an operator held the target at call %d, before it started (call %d)",
			t, a.name, src, old+1, now, since, a.startCall)
	}
	sh := c.tgt[t]
	want := map[string]relaycore.Write{}
	for _, r := range rows {
		for _, kv := range r.Puts {
			sh.model[kv.Key] = kv.Value
			want[kv.Key] = relaycore.Write{Key: kv.Key, Value: kv.Value}
		}
		for _, k := range r.Deletes {
			delete(sh.model, k)
			want[k] = relaycore.Write{Key: k, Delete: true}
		}
	}
	for _, kv := range s.sc.hookObs[t] {
		sh.model[hookPrefix+kv.Key] = kv.Value
	}
	s.res.Delivered += len(rows)
	s.res.Batches++
	if a == nil {
		return // sabotage: no engine batch to compare
	}

	// The logged batch: guarded on the old rh, advancing it to new, with
	// exactly the rows' coalesced writes (plus hook writes).
	rhKey := relaycore.RHKey(src)
	guarded := slices.ContainsFunc(req.batch.Preconditions, func(pc relaycore.Precondition) bool {
		if pc.Key != rhKey {
			return false
		}
		if old == 0 {
			return pc.Absent || string(pc.Value) == "0"
		}
		return !pc.Absent && string(pc.Value) == strconv.FormatUint(old, 10)
	})
	if !guarded {
		s.violate("target %s: batch by %s moved rh %s %d -> %d without a guard on rh = %d", t, a.name, src, old, now, old)
	}
	got := map[string]relaycore.Write{}
	for _, w := range req.batch.Writes {
		switch {
		case w.Key == rhKey:
			if w.Delete || string(w.Value) != strconv.FormatUint(now, 10) {
				s.violate("target %s: batch writes rh %q, store has %d", t, w.Value, now)
			}
		case strings.HasPrefix(w.Key, hookPrefix):
		default:
			got[w.Key] = w
		}
	}
	if len(got) != len(want) {
		s.violate("target %s: batch of %s for rows %d..%d writes %d keys, the rows coalesce to %d", t, src, old+1, now, len(got), len(want))
		return
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok || g.Delete != w.Delete || !bytes.Equal(g.Value, w.Value) {
			s.violate("target %s: batch of %s for rows %d..%d: key %s written as %+v, rows say %+v", t, src, old+1, now, k, g, w)
			return
		}
	}
}

// commitReturned checks an Enqueue result against what the stores
// saw: every reported seq holds that input row and was committed by this
// call; every row this call committed is reported (unless the engine said
// the outcome is unknown); a target's rows keep their input order.
func (c *checker) commitReturned(a *actor, rows []relaycore.Row, res relaycore.CommitResult, err error) {
	s := c.s
	sh := c.src[a.source]
	if len(res.Seqs) != len(rows) {
		s.violate("%s: Enqueue returned %d seqs for %d rows (err %v)", a.name, len(res.Seqs), len(rows), err)
		return
	}
	reported := map[uint64]bool{}
	for i, seq := range res.Seqs {
		if seq == 0 {
			if err == nil {
				s.violate("%s: Enqueue succeeded but row %d has no seq", a.name, i)
			}
			continue
		}
		if reported[seq] {
			s.violate("%s: seq %d reported for two rows", a.name, seq)
		}
		reported[seq] = true
		reg := sh.reg[seq]
		switch {
		case reg == nil:
			s.violate("%s: row %d reported committed as seq %d, which was never in the outbox (err %v)", a.name, i, seq, err)
		case reg.actor != a.id || reg.call != a.call:
			s.violate("%s: row %d reported as seq %d, which another call committed (reused seq)", a.name, i, seq)
		case !sameRow(reg.row, rows[i]):
			s.violate("%s: row %d reported as seq %d, which holds %s, not %s", a.name, i, seq, fmtRow(reg.row), fmtRow(rows[i]))
		}
		for j := range i {
			if rows[j].Target == rows[i].Target && res.Seqs[j] != 0 && res.Seqs[j] > seq {
				s.violate("%s: rows %d and %d for %s got seqs %d > %d (input order lost)", a.name, j, i, rows[i].Target, res.Seqs[j], seq)
			}
		}
	}
	unknown := errors.Is(err, relaycore.ErrCommitUnknown)
	for _, seq := range sh.byCall[[2]int{a.id, a.call}] {
		if !reported[seq] && !unknown {
			s.violate("%s: seq %d was committed by this call but not reported (err %v): a retry would duplicate it", a.name, seq, err)
		}
	}
	// ErrLeaseRequired may follow committed rows: links of a chain that
	// landed before the source became lease-required (a later link's os
	// guard then fails and the re-read finds the flag). They are reported
	// (checked above), and checkEnqueuer has already refused any row
	// committed without a lease guard once the source was lease-required.
	if errors.Is(err, relaycore.ErrInvalidRow) || errors.Is(err, relaycore.ErrCorruptRecord) || errors.Is(err, relaycore.ErrBatchTooLarge) {
		s.violate("%s: Enqueue refused a generated workload: %v", a.name, err)
	}
}

// afterSabotage re-checks every partition after the self-test's raw write.
func (c *checker) afterSabotage() {
	pseudo := &actor{name: "sabotage", kind: kindDrain}
	for _, p := range c.s.sc.Sources {
		c.afterSource(pseudo, &request{op: opApply, p: p})
	}
	for _, t := range c.s.sc.Targets {
		c.afterTarget(nil, &request{op: opApply, target: true, p: t})
	}
}

// drained reports whether every outbox holds only rows of permanently
// failing targets.
func (c *checker) drained() bool {
	for _, p := range c.s.sc.Sources {
		for _, r := range c.src[p].rows {
			if !c.s.permanentlyDown(r.Target) {
				return false
			}
		}
	}
	return true
}

// quiescence checks the end state: healthy targets drained and equal to
// the model rebuilt from scratch, every seq accounted for, the queries
// exact, empty sources without an alarm, and the shadows equal to the
// stores.
func (c *checker) quiescence() {
	s := c.s
	add := func(format string, args ...any) {
		s.res.Violations = append(s.res.Violations, Violation{Text: fmt.Sprintf(format, args...)})
	}
	if !s.drained {
		for _, p := range s.sc.Sources {
			for _, seq := range sortedSeqs(c.src[p].rows) {
				if r := c.src[p].rows[seq]; !s.permanentlyDown(r.Target) {
					add("source %s: row %d for healthy target %s never delivered (rh %d)", p, seq, r.Target, c.tgt[r.Target].rh[p])
					break
				}
			}
		}
	}
	for _, p := range s.sc.Sources {
		sh := c.src[p]
		v, err := relaycore.InspectSource(s.ctx, s.raw.Source, p)
		if err != nil {
			add("inspect %s: %v", p, err)
			continue
		}
		if n := len(v.Rows()); n != len(sh.rows) {
			add("source %s: store holds %d rows, the checker saw %d", p, n, len(sh.rows))
		}
		for seq := uint64(1); seq < v.OS.NextSeq; seq++ {
			r := sh.reg[seq]
			if r == nil {
				add("source %s: seq %d below os.next %d was never committed (lost seq)", p, seq, v.OS.NextSeq)
				continue
			}
			if _, queued := sh.rows[seq]; !queued && !sh.skipped[seq] && c.tgt[r.row.Target].rh[p] < seq {
				add("source %s: seq %d is neither queued nor delivered to %s (rh %d)", p, seq, r.row.Target, c.tgt[r.row.Target].rh[p])
			}
		}
		if uint64(len(sh.reg)) != v.OS.NextSeq-1 {
			add("source %s: %d rows committed, os.next %d", p, len(sh.reg), v.OS.NextSeq)
		}
		archivedRows := 0
		for _, e := range v.Archive {
			archivedRows += len(e.Rows)
		}
		if archivedRows != len(sh.skipped) || v.Hold.Archived != uint64(archivedRows) {
			add("source %s: the archive holds %d rows (q says %d), the checker saw %d skipped", p, archivedRows, v.Hold.Archived, len(sh.skipped))
		}
		// The per-target records agree with the outbox.
		queued := map[relaycore.Partition]uint64{}
		for _, r := range sh.rows {
			queued[r.Target]++
		}
		for _, ts := range v.Targets {
			if ts.Pending != queued[ts.Target] {
				add("source %s: target %s record says %d pending, the outbox holds %d", p, ts.Target, ts.Pending, queued[ts.Target])
			}
			delete(queued, ts.Target)
		}
		for t, n := range queued {
			add("source %s: %d rows queued for %s, which has no target record", p, n, t)
		}
		if len(sh.rows) == 0 && v.Alarm != nil {
			add("source %s: outbox empty after the final alarm but the alarm record remains (%+v)", p, *v.Alarm)
		}
		c.checkQueries(p, true)
	}
	for _, t := range s.sc.Targets {
		items, err := c.scanAll(s.raw.Target, t)
		if err != nil {
			add("%v", err)
			continue
		}
		model := map[string][]byte{}
		delivered := false
		for _, p := range s.sc.Sources {
			rh := c.tgt[t].rh[p]
			if got := parseRH(items[relaycore.RHKey(p)]); got != rh {
				add("target %s: rh %s is %d, the checker saw %d", t, p, got, rh)
			}
			delivered = delivered || rh > 0
			sh := c.src[p]
			for _, seq := range slices.Sorted(maps.Keys(sh.reg)) {
				r := sh.reg[seq].row
				if r.Target != t || sh.skipped[seq] {
					continue
				}
				if seq > rh {
					if !s.permanentlyDown(t) {
						add("target %s: healthy, but row %s/%d is beyond rh %d", t, p, seq, rh)
					}
					continue
				}
				for _, kv := range r.Puts {
					model[kv.Key] = kv.Value
				}
				for _, k := range r.Deletes {
					delete(model, k)
				}
			}
		}
		if delivered {
			for _, kv := range s.sc.hookObs[t] {
				model[hookPrefix+kv.Key] = kv.Value
			}
		}
		for k, v := range items {
			if strings.HasPrefix(k, relaycore.ReservedPrefix) {
				continue
			}
			if w, ok := model[k]; !ok || !bytes.Equal(w, v) {
				add("target %s: final %s = %q, model %s", t, k, clip(v, 40), fmtModel(w, ok))
			}
		}
		for k, w := range model {
			if _, ok := items[k]; !ok {
				add("target %s: final %s missing, model %q", t, k, clip(w, 40))
			}
		}
	}
}

func parseRH(v []byte) uint64 {
	n, _ := strconv.ParseUint(string(v), 10, 64)
	return n
}

func fmtRow(r relaycore.Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{%s", r.Target)
	for _, kv := range r.Puts {
		fmt.Fprintf(&b, " +%s=%q", kv.Key, clip(kv.Value, 20))
	}
	for _, k := range r.Deletes {
		fmt.Fprintf(&b, " -%s", k)
	}
	b.WriteString("}")
	return b.String()
}
