package relaycore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// deliver is a fire's third step: held rows that are due first, then the
// targets the scan selected.
func (f *fireRun) deliver() {
	res := f.res
	res.TargetsRedriven += len(f.redrive)
	f.carry(f.redrive)
	f.h.deliverTargets(f.ctx, f.source, f.redrive, res, f.b, f.spent)
	res.TargetsAttempted += len(f.sel)
	f.carry(f.sel)
	f.h.deliverTargets(f.ctx, f.source, f.sel, res, f.b, f.spent)
}

// carry sets the rh each of tws carries (carriedRH): the one its record
// holds as the last checkpoint left it, or the one this fire's delivery of
// the target's held rows left, which ran first and knows better.
func (f *fireRun) carry(tws []*targetWork) {
	for _, tw := range tws {
		if slot, ok := f.recs[tw.target]; ok {
			tw.carried = slot.before.Through
		}
		for _, d := range f.redrive {
			if d != tw && d.target == tw.target {
				tw.carried = max(tw.carried, d.dt)
			}
		}
	}
}

// deliverTargets delivers to each of tws: one after another, or up to
// DeliverConcurrency at once. deliver touches only its own targetWork and,
// under spent.mu, the budget and the result's counters.
func (h *RelayHandler) deliverTargets(ctx context.Context, source Partition, tws []*targetWork, res *FireResult, b RelayBudget, spent *fireSpend) {
	if h.DeliverConcurrency <= 1 || len(tws) <= 1 {
		for _, tw := range tws {
			h.deliverTarget(ctx, source, tw, res, b, spent)
		}
		return
	}
	sem := make(chan struct{}, h.DeliverConcurrency)
	var wg sync.WaitGroup
	for _, tw := range tws {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			h.deliverTarget(ctx, source, tw, res, b, spent)
		}()
	}
	wg.Wait()
}

// deliverTarget applies tw's rows newer than the target's rh, in ascending seq,
// in as many target batches as the limits and CallsPerTarget allow. It sets
// tw.dt to the rh it last knew and tw.failed on a delivery or hook failure.
//
// The first batch is guarded on the carried rh when carriedRH allows it,
// else on rh as read. A carried guard is a guess until a batch lands on it
// or a read confirms it: when its precondition fails (or the outcome is
// unknown), rh is read and delivery goes on from what it says, as after any
// conflict, so nothing is applied twice or skipped; a delivery that never
// confirms it leaves tw.dt at 0, as a failed read does, so the checkpoint
// cleans nothing on the guess's word.
func (h *RelayHandler) deliverTarget(ctx context.Context, source Partition, tw *targetWork, res *FireResult, b RelayBudget, spent *fireSpend) {
	log := loggerOr(h.Logger).With("source", string(source), "target", string(tw.target))
	fail := func(class, msg string, err error) {
		log.Warn("relay target failed: "+msg, "class", class, "err", err)
		tw.failed = true
		tw.failure = LastError{Class: class, Message: msg + ": " + err.Error()}
		if len(tw.rows) > 0 {
			tw.failure.Seq = tw.rows[0].Seq
			if i, _ := slices.BinarySearchFunc(tw.rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) }); i < len(tw.rows) {
				tw.failure.Seq = tw.rows[i].Seq
			}
		}
	}
	rh, err := h.firstGuard(ctx, source, tw, res, b, spent)
	if err != nil {
		fail(ErrorClassRead, "read rh", err)
		return
	}
	tw.dt = rh.seq
	defer func() {
		if rh.guessed {
			tw.dt = 0 // never confirmed: the fire knows no rh
		}
	}()
	newer := func(rows []Row) []Row {
		i, _ := slices.BinarySearchFunc(rows, tw.dt+1, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
		return rows[i:]
	}
	pending := newer(tw.rows)
	tc := h.Target.Capabilities()
	attempt := 0
	// reserved is a call taken from the budget and not yet made: a
	// failure before the Apply gives it back.
	reserved := false
	defer func() {
		if reserved {
			spent.unreserve(tw.target)
		}
	}()
	for len(pending) > 0 {
		if !spent.reserve(b, tw.target) {
			return // budget spent; not a failure: the cursor pauses before these rows
		}
		reserved = true
		attempt++
		n := fitRows(source, tw.target, pending, tc, 0, 0)
		if n == 0 {
			// Enqueue validation keeps every row within one target batch
			// of the limits it was given; a target store with smaller
			// limits (or a hostile page) can still hold one that is not.
			fail(ErrorClassTooLarge, "row does not fit one target batch", fmt.Errorf("row %d: %w", pending[0].Seq, ErrBatchTooLarge))
			return
		}
		n, trimmed := tw.trimLastCall(spent, b, pending, n)
		hookWrites, n, ok := h.askHook(ctx, source, tw.target, pending, n, attempt, tc, fail)
		if !ok {
			return
		}
		last := pending[n-1].Seq
		batch := targetBatch(RHKey(source), rh.raw, rh.found, last, pending[:n], hookWrites)
		if err := tc.Check(tw.target, batch); err != nil {
			fail(ErrorClassTooLarge, "plan target batch", err)
			return
		}
		reserved = false
		spent.count(func() { res.TargetCalls++ })
		err := h.Target.Apply(ctx, tw.target, batch)
		if err == nil {
			// Reported delivered once the checkpoint records them
			// (fireRun.recorded); here they only count as progress.
			spent.count(func() { spent.delivered += n })
			tw.dt, rh = last, rhView{raw: encodeRH(last), found: true, seq: last}
			pending = pending[n:]
			if trimmed {
				return // not a failure: the cursor pauses before the rows trimmed
			}
			continue
		}
		// The batch's one precondition is the rh guard: a failed
		// precondition says rh is not the guard, and nothing else does.
		if _, cond := FailedPrecondition(err); !cond && !MayBeApplied(err) {
			// Surely not applied, for a reason other than the guard: a
			// failed attempt, whether the guard was read or carried.
			tw.failedCalls++
			fail(ErrorClassApply, "apply", err)
			return
		}
		// rh moved (another deliverer), is not the carried value (a crash
		// between a target batch and the checkpoint that records it, a
		// record of an older release), or the outcome is unknown: rh says
		// what is applied, because every target batch advances it.
		guard := rh
		var rerr error
		if rh, rerr = h.readRH(ctx, source, tw, res, spent); rerr != nil {
			rh.guessed = guard.guessed
			fail(ErrorClassRead, "re-read rh", rerr)
			return
		}
		if guard.guessed {
			tw.dt = rh.seq // what was read replaces the guess, above it or not
		}
		if rh.found == guard.found && bytes.Equal(rh.raw, guard.raw) {
			// rh is still what the batch was guarded on: it did not land and
			// no other deliverer moved it. That is a failed attempt like any
			// other (a full disk under a bbolt target says "outcome unknown"
			// on every commit); trying again at once would spend the budget
			// without a word and leave the target looking healthy.
			tw.failedCalls++
			fail(ErrorClassApply, "apply (rh unchanged: not applied)", err)
			return
		}
		if rh.seq >= last && MayBeApplied(err) {
			spent.count(func() { spent.delivered += n })
		}
		tw.dt = max(tw.dt, rh.seq)
		pending = newer(tw.rows)
	}
}

// rhView is what a target's delivery knows of its rh: the value (raw, as
// stored; seq, decoded) its next batch is guarded on.
type rhView struct {
	raw   []byte
	found bool
	seq   uint64
	// guessed: carried (carriedRH), not yet confirmed by a read or by a
	// batch that landed on it.
	guessed bool
}

// readRH reads tw's target's rh for source.
func (h *RelayHandler) readRH(ctx context.Context, source Partition, tw *targetWork, res *FireResult, spent *fireSpend) (rhView, error) {
	spent.count(func() { res.TargetReads++ })
	raw, found, err := h.Target.Get(ctx, tw.target, RHKey(source))
	if err != nil {
		return rhView{}, err
	}
	v, err := decodeRH(raw, found)
	return rhView{raw: raw, found: found, seq: v}, err
}

// firstGuard is what tw's first target batch is guarded on: the carried rh
// when carriedRH allows it (0: absent, never delivered), else rh as read.
func (h *RelayHandler) firstGuard(ctx context.Context, source Partition, tw *targetWork, res *FireResult, b RelayBudget, spent *fireSpend) (rhView, error) {
	if !tw.carriedRH(b, spent) {
		return h.readRH(ctx, source, tw, res, spent)
	}
	v := rhView{seq: tw.carried, guessed: true}
	if v.seq > 0 {
		v.raw, v.found = encodeRH(v.seq), true
	}
	return v, nil
}

// carriedRH reports whether tw's first target batch may be guarded on the
// carried rh, saving the read: only fires of this source write the
// target's rh, under the source's claim, and each checkpoint records the rh
// its fire left (the target record's Through, folded in rs), so the carried
// value is rh unless a batch landed after the last checkpoint (a fire that
// crashed or lost its checkpoint, one that took over a lapsed claim), or
// the record predates it. It must leave no row unoffered on the guess's
// word (every collected row is newer than it), and the budget a call for
// the batch after a wrong guess (with fewer than two left it reads first),
// so a wrong guess costs one refused batch and a read, never a row or a
// round.
func (tw *targetWork) carriedRH(b RelayBudget, spent *fireSpend) bool {
	if len(tw.rows) == 0 || tw.rows[0].Seq <= tw.carried {
		return false
	}
	return spent.left(b, tw.target) >= 2
}

// askHook asks the hook for its writes beside pending[:n], shrinking n
// until the rows and the writes fit one target batch. ok false: the hook
// failed, or its writes leave no room for a row (fail says which).
func (h *RelayHandler) askHook(ctx context.Context, source, target Partition, pending []Row, n, attempt int, tc Capabilities, fail func(class, msg string, err error)) ([]Write, int, bool) {
	for {
		items, size := targetLoad(source, target, pending[:n], tc)
		req := HookRequest{Source: source, Target: target, Rows: slices.Clone(pending[:n]), Attempt: attempt,
			RoomItems: room(tc.MaxBatchItems, items), RoomBytes: room(tc.MaxBatchBytes, size)}
		hookWrites, err := h.hook().BeforeApply(ctx, req)
		if err != nil {
			fail(ErrorClassHook, "hook", err)
			return nil, 0, false
		}
		if err := checkHookWrites(hookWrites, pending[:n]); err != nil {
			fail(ErrorClassHook, "hook writes", err)
			return nil, 0, false
		}
		extra := 0
		for _, w := range hookWrites {
			extra += tc.ItemSize(target, w.Key, len(w.Value))
		}
		m := fitRows(source, target, pending[:n], tc, len(hookWrites), extra)
		if m == n {
			return hookWrites, n, true
		}
		if m == 0 {
			fail(ErrorClassHook, "hook additions leave no room for a row", ErrBatchTooLarge)
			return nil, 0, false
		}
		n = m // shrink and ask the hook again for the smaller group
	}
}

func room(limit, used int) int {
	if limit <= 0 {
		return 1 << 30
	}
	return limit - used
}

// coalesce folds rows (ascending seq) into one write per key: the newest
// put or delete wins, because a transaction cannot touch a key twice.
func coalesce(rows []Row) map[string]Write {
	out := map[string]Write{}
	for _, r := range rows {
		for _, kv := range r.Puts {
			out[kv.Key] = Write{Key: kv.Key, Value: kv.Value}
		}
		for _, k := range r.Deletes {
			out[k] = Write{Key: k, Delete: true}
		}
	}
	return out
}

// targetLoad is the items and bytes of rows' coalesced writes plus rh.
func targetLoad(source, target Partition, rows []Row, tc Capabilities) (int, int) {
	items, size := 1, tc.ItemSize(target, RHKey(source), 20)
	for _, w := range coalesce(rows) {
		items++
		size += tc.ItemSize(target, w.Key, len(w.Value))
	}
	return items, size
}

// fitRows is how many leading rows fit one target batch together with rh
// and extraItems/extraBytes of hook writes.
func fitRows(source, target Partition, rows []Row, tc Capabilities, extraItems, extraBytes int) int {
	sizes := map[string]int{}
	items, total := 1+extraItems, tc.ItemSize(target, RHKey(source), 20)+extraBytes
	for i, r := range rows {
		addItems, addBytes := 0, 0
		visit := func(k string, vlen int) {
			s := tc.ItemSize(target, k, vlen)
			if old, ok := sizes[k]; ok {
				addBytes += s - old
			} else {
				addItems++
				addBytes += s
			}
		}
		for _, kv := range r.Puts {
			visit(kv.Key, len(kv.Value))
		}
		for _, k := range r.Deletes {
			visit(k, 0)
		}
		if (tc.MaxBatchItems > 0 && items+addItems > tc.MaxBatchItems) || (tc.MaxBatchBytes > 0 && total+addBytes > tc.MaxBatchBytes) {
			return i
		}
		items, total = items+addItems, total+addBytes
		for _, kv := range r.Puts {
			sizes[kv.Key] = tc.ItemSize(target, kv.Key, len(kv.Value))
		}
		for _, k := range r.Deletes {
			sizes[k] = tc.ItemSize(target, k, 0)
		}
	}
	return len(rows)
}

func checkHookWrites(ws []Write, rows []Row) error {
	keys := coalesce(rows)
	seen := map[string]bool{}
	for _, w := range ws {
		switch {
		case w.Key == "":
			return fmt.Errorf("%w: hook write with an empty key", ErrInvalidBatch)
		case strings.HasPrefix(w.Key, ReservedPrefix):
			return fmt.Errorf("%w: hook write to reserved key %q", ErrInvalidBatch, w.Key)
		case seen[w.Key]:
			return fmt.Errorf("%w: hook writes key %q twice", ErrInvalidBatch, w.Key)
		}
		if _, ok := keys[w.Key]; ok {
			return fmt.Errorf("%w: hook writes key %q that a row writes", ErrInvalidBatch, w.Key)
		}
		seen[w.Key] = true
	}
	return nil
}

// targetBatch guards rh on the value read and advances it to last, with the
// rows' coalesced writes and the hook's writes, atomically.
func targetBatch(rhKey string, rhRaw []byte, rhFound bool, last uint64, rows []Row, hookWrites []Write) Batch {
	pre := Precondition{Key: rhKey, Absent: true}
	if rhFound {
		pre = Precondition{Key: rhKey, Value: rhRaw}
	}
	cw := coalesce(rows)
	writes := make([]Write, 0, len(cw)+len(hookWrites)+1)
	for _, w := range cw {
		writes = append(writes, w)
	}
	slices.SortFunc(writes, func(a, b Write) int { return strings.Compare(a.Key, b.Key) })
	writes = append(writes, hookWrites...)
	writes = append(writes, Write{Key: rhKey, Value: encodeRH(last)})
	return Batch{Preconditions: []Precondition{pre}, Writes: writes}
}

// trimLastCall: the fire's last call for tw's target (its rows or its
// calls end with pending[:n]) ends at a page end when one lies within it
// (toPageEnd); trimmed says the rows after it wait for the next fire.
func (tw *targetWork) trimLastCall(spent *fireSpend, b RelayBudget, pending []Row, n int) (int, bool) {
	if n < len(pending) && spent.left(b, tw.target) > 0 {
		return n, false
	}
	m := tw.toPageEnd(pending, n)
	return m, m < n
}

// toPageEnd trims the fire's last apply for a target, pending[:n], to end
// with the last row of a page when one ends within it. A page the fire
// leaves partly delivered is rewritten by the checkpoint with its
// remaining rows (checkpointBatch.clean): on DynamoDB a transactional put
// billed at 2 units per started KB, and its delete later, for rows the next
// fire delivers anyway. The rows trimmed wait for that fire, which starts
// at a page boundary; no extra apply call is made in this one. n itself
// when no page ends within pending[:n] (the call is then worth making).
func (tw *targetWork) toPageEnd(pending []Row, n int) int {
	// The last page that ends at or before the call's last row; pages
	// are ascending and hold the rows of pending.
	j, _ := slices.BinarySearchFunc(tw.pages, pending[n-1].Seq+1, func(p *Page, s uint64) int { return cmpU64(p.Last(), s) })
	if j == 0 {
		return n
	}
	end := tw.pages[j-1].Last()
	i, found := slices.BinarySearchFunc(pending[:n], end, func(r Row, s uint64) int { return cmpU64(r.Seq, s) })
	if !found {
		return n // that page ends before the call's first row
	}
	return i + 1
}
