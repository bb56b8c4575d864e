// Package alarmclock runs a source's alarms inside one process: the
// embedded counterpart of EventBridge Scheduler (fast path) plus the sweep
// Lambda (safety net).
//
// Kick records a wake-up in a timer heap; Run pops due wake-ups and calls
// the relay handler's Alarm for that source, on a bounded pool of workers,
// never two alarms for one source at once (the engine would tolerate it,
// but it would only waste a claim). Every SweepInterval, Run also lists the
// store's overdue durable alarm records through relaycore.DueIndex and
// fires them, so a kick lost before the process restarted is healed the
// same way the sweep function heals a lost schedule in the cloud. An alarm
// that meets another holder's claim (one left by a process killed
// mid-fire) kicks the clock for the moment that claim lapses, so such a
// source waits out the claim, not the sweep. With Config.Linger, a source
// that keeps getting rows is fired at most every 1+Linger fires' time, so
// each fire carries more of them (see Config.Linger for why).
//
// Several clocks (one per `relay serve` replica) may share one store. Each
// is kicked by its own process's enqueues and re-arms, so a source is
// fired where it was written to or last fired. Every clock sweeps the same
// due index, so a wake-up the clock did not get from a kick (one the
// sweep found, or the retry of an alarm that met a claim) is checked
// first (relaycore.CheckAlarm: one read): a source whose alarm is gone or
// not yet due, or that a live claim holds, is left to whoever holds it,
// and a claim met by a sweep's wake-up is tried once more when it lapses
// (its holder may have died), not again while claims keep being renewed
// (their holders are alive, and the next sweep looks again). Each clock
// fires what its sweep found in its own order (a hash of Config.Replica
// and the source), so clocks that sweep together start at different
// sources. Claims and guarded batches keep fires safe whatever the clocks
// do; this only keeps them from doing one another's work, and it cannot
// strand a source: a source left alone is one whose alarm record is gone
// (nothing to fire), due later (whoever re-armed it was kicked), or held
// by a live claim (its holder re-arms when it ends; a holder that died
// leaves an overdue alarm that every clock's next sweep finds once the
// claim lapses, so its sources are fired within claim TTL plus the sweep
// period).
package alarmclock

import (
	"container/heap"
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

var _ relaycore.Kicker = (*Clock)(nil)

// Alarmer runs one alarm for a source; *relaycore.RelayHandler is one.
type Alarmer interface {
	Alarm(ctx context.Context, source relaycore.Partition) (relaycore.AlarmResult, error)
}

// Config wires a Clock. Handler is required; the rest have defaults.
type Config struct {
	// Handler runs alarms.
	Handler Alarmer
	// Index lists overdue durable alarm records (the safety net). Nil
	// disables sweeping.
	Index relaycore.DueIndex
	// Source is the store holding the alarm records and claims (the
	// handler's Source). With it, wake-ups the clock did not get from a
	// kick are checked before they fire (see the package doc); nil fires
	// them unchecked, which only a clock alone on its store can afford.
	Source relaycore.Store
	// Replica names this clock among the clocks sharing one store; it
	// seeds the order in which the sweep fires what it found, so give
	// each replica its own name.
	Replica string
	// Clock tells the time (default relaycore.SystemClock); share the
	// handler's.
	Clock relaycore.Clock
	// Workers bounds concurrent alarms (default 4).
	Workers int
	// SweepInterval is the safety-net period (default 1 minute, the
	// cloud sweep's rate).
	SweepInterval time.Duration
	// SweepLimit bounds alarms fired per sweep (default 256).
	SweepLimit int
	// Linger holds a busy source's next fire: after an alarm that
	// delivered all it found and re-armed its source due at once (rows
	// came while it ran), the source waits Linger times that alarm's
	// duration, at most MaxLinger, before it fires again. Zero fires it at once. Why: a
	// fire's cost is mostly fixed (about twenty store calls: the claim,
	// the scans, the checkpoint, the re-arm and one batch per target,
	// whatever the rows), and a source fired back to back carries only
	// the rows that came during its last fire, fewer the more fires run
	// at once. So extra workers or replicas on a saturated machine or
	// database make more, smaller fires and deliver less; a hold makes
	// each fire carry what came during 1+Linger fires, and costs a row
	// at most Linger fires' time. It never delays a source's first fire
	// after a quiet spell (nothing re-armed it), a backlog (an alarm whose
	// budget ran out before the rows did: AlarmResult.More), a back-off
	// or a retry.
	Linger float64
	// MaxLinger caps the hold (default 1 s). Keep it under a second or
	// so: an enqueue that finds its source's alarm overdue for longer
	// than relaycore's kick grace (2 s) kicks again, ending the hold.
	MaxLinger time.Duration
	// Observe, when set, is called after every alarm (from the worker
	// goroutine that ran it).
	Observe func(source relaycore.Partition, res relaycore.AlarmResult, err error)
	// ObserveSweep, when set, is called after every sweep with the number
	// of overdue alarms it found and the error that stopped it (listing
	// the due index failed), for metrics: a sweep that keeps failing
	// leaves lost kicks unhealed.
	ObserveSweep func(found int, err error)
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Clock is an in-process alarm scheduler. Create with New, then Run.
type Clock struct {
	cfg Config

	mu      sync.Mutex
	pending wakeHeap                     // due wake-ups, earliest first
	dueOf   map[relaycore.Partition]pend // earliest pending wake-up per source
	running map[relaycore.Partition]bool // sources with an alarm in progress
	rerun   map[relaycore.Partition]pend // wake-ups that arrived while running
	changed chan struct{}                // wakes Run when the heap changes
	stats   Stats
}

// Stats counts the clock's work.
type Stats struct {
	Kicks, Alarms, SweepFound, Errors int64
	// Lingered counts fires held back by Config.Linger.
	Lingered int64
	// SweepErrors counts sweeps that could not list the due index.
	SweepErrors int64
	// Busy counts alarms that met another holder's claim (wasted: one
	// read each).
	Busy int64
	// Checks counts wake-ups checked before firing; of them, SkippedDone
	// found no alarm due (another clock fired the source, or re-armed it
	// for later) and SkippedClaimed a live claim. CheckErrors could not
	// read (retried after a second).
	Checks, SkippedDone, SkippedClaimed, CheckErrors int64
}

// kind is where a wake-up came from, which decides whether it is checked.
type kind uint8

const (
	// kicked: a Kick (an enqueue or a re-arm here): fired when due.
	kicked kind = iota
	// swept: found overdue by the sweep: checked; met a claim: retried
	// when it lapses.
	swept
	// retried: the retry after a claim met: checked; met a live claim
	// again: dropped (its holder is alive; the sweep looks again).
	retried
)

// pend is one pending wake-up of a source.
type pend struct {
	due   int64
	kind  kind
	order uint64 // sweep order among wake-ups due at one instant
}

// before reports whether p should replace q: earlier, or as early and
// needing less checking.
func (p pend) before(q pend) bool {
	return p.due < q.due || (p.due == q.due && p.kind < q.kind)
}

// New returns a Clock; it does nothing until Run.
func New(cfg Config) *Clock {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Minute
	}
	if cfg.SweepLimit <= 0 {
		cfg.SweepLimit = 256
	}
	if cfg.MaxLinger <= 0 {
		cfg.MaxLinger = DefaultMaxLinger
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = relaycore.SystemClock{}
	}
	return &Clock{
		cfg:     cfg,
		dueOf:   map[relaycore.Partition]pend{},
		running: map[relaycore.Partition]bool{},
		rerun:   map[relaycore.Partition]pend{},
		changed: make(chan struct{}, 1),
	}
}

// Kick implements relaycore.Kicker: wake source's alarm at dueMS. Kicks for
// a source collapse to the earliest pending one. It never fails.
func (c *Clock) Kick(_ context.Context, source relaycore.Partition, dueMS int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Kicks++
	c.schedule(source, pend{due: dueMS})
	return nil
}

// schedule needs c.mu.
func (c *Clock) schedule(source relaycore.Partition, p pend) {
	if c.running[source] {
		if d, ok := c.rerun[source]; !ok || p.before(d) {
			c.rerun[source] = p
		}
		return
	}
	if d, ok := c.dueOf[source]; ok && !p.before(d) {
		return
	}
	c.dueOf[source] = p
	heap.Push(&c.pending, wake{source: source, pend: p})
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the counters.
func (c *Clock) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Idle reports whether no alarm is pending or running.
func (c *Clock) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.dueOf) == 0 && len(c.running) == 0 && len(c.rerun) == 0
}

// NextDue returns the earliest pending wake-up (unix ms) and whether there is one.
func (c *Clock) NextDue() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending.Len() > 0 {
		w := c.pending[0]
		if c.dueOf[w.source] != w.pend {
			heap.Pop(&c.pending) // superseded by an earlier kick
			continue
		}
		return w.due, true
	}
	return 0, false
}

// Run fires due alarms until ctx is cancelled, then waits for running
// alarms and returns ctx's error.
func (c *Clock) Run(ctx context.Context) error {
	work := make(chan wake)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range work {
				c.runAlarm(ctx, w.source, w.pend)
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()

	sweep := time.NewTicker(c.cfg.SweepInterval)
	defer sweep.Stop()
	// The first sweep also takes the alarms due before the second: a new
	// process has none of the timers its predecessor set (a back-off
	// re-arm, a retry when a claim lapses), and the sweep alone would find
	// each up to a sweep period late.
	c.sweepAhead(ctx, c.cfg.SweepInterval.Milliseconds())
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w, wait, ok := c.popDue(c.nowMS())
		if ok {
			select {
			case work <- w:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.changed:
		case <-timer.C:
		case <-sweep.C:
			c.sweep(ctx)
		}
	}
}

func (c *Clock) nowMS() int64 { return c.cfg.Clock.Now().UnixMilli() }

// popDue takes the earliest due wake-up if it is due at nowMS, marking its
// source running; otherwise it says how long to wait.
func (c *Clock) popDue(nowMS int64) (wake, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending.Len() > 0 {
		w := c.pending[0]
		if c.dueOf[w.source] != w.pend {
			heap.Pop(&c.pending)
			continue
		}
		if w.due > nowMS {
			return wake{}, time.Duration(w.due-nowMS) * time.Millisecond, false
		}
		heap.Pop(&c.pending)
		delete(c.dueOf, w.source)
		c.running[w.source] = true
		return w, 0, true
	}
	return wake{}, time.Hour, false
}

// DefaultMaxLinger is Config.MaxLinger's default.
const DefaultMaxLinger = time.Second

// retryAfterError is how soon a source whose alarm or check failed on a
// store error is tried again: storage trouble, not a reason to wait for
// the sweep.
const retryAfterError = time.Second

func (c *Clock) runAlarm(ctx context.Context, src relaycore.Partition, p pend) {
	if p.kind != kicked && c.cfg.Source != nil {
		if next, fire := c.check(ctx, src, p); !fire {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.done(src, next)
			return
		}
	}
	start := c.cfg.Clock.Now()
	res, err := c.cfg.Handler.Alarm(ctx, src)
	took := c.cfg.Clock.Now().Sub(start)
	if err != nil && !errors.Is(err, context.Canceled) {
		c.cfg.Logger.Warn("relay alarm failed; retrying after the sweep interval or the next kick", "source", string(src), "err", err)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(src, res, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Alarms++
	if err != nil {
		c.stats.Errors++
	}
	if res.Busy {
		c.stats.Busy++
		// The alarm kicked us for when the claim it met lapses: that
		// wake-up is a retry, checked before it fires (the claim's
		// holder, when alive, re-arms and fires the source itself).
		if r, ok := c.rerun[src]; ok && r == (pend{due: res.BusyRetryMS}) {
			c.rerun[src] = pend{due: r.due, kind: retried}
		}
	}
	if err == nil && res.Progress && !res.More {
		c.linger(src, took)
	}
	var next *pend
	if err != nil && !errors.Is(err, context.Canceled) {
		next = &pend{due: c.nowMS() + retryAfterError.Milliseconds(), kind: p.kind}
	}
	c.done(src, next)
}

// linger holds src's next fire after an alarm that made progress and took
// took, when that alarm's re-arm kicked src due before the hold ends (see
// Config.Linger). It needs c.mu.
func (c *Clock) linger(src relaycore.Partition, took time.Duration) {
	r, ok := c.rerun[src]
	if !ok || r.kind != kicked || c.cfg.Linger <= 0 {
		return
	}
	hold := min(time.Duration(c.cfg.Linger*float64(took)), c.cfg.MaxLinger)
	if until := c.nowMS() + hold.Milliseconds(); r.due < until {
		c.rerun[src] = pend{due: until}
		c.stats.Lingered++
	}
}

// check runs before a wake-up the clock did not get from a kick: fire
// says whether to run the alarm; otherwise next (nil: none) is the
// wake-up to keep instead.
func (c *Clock) check(ctx context.Context, src relaycore.Partition, p pend) (next *pend, fire bool) {
	now := c.cfg.Clock.Now()
	chk, err := relaycore.CheckAlarm(ctx, c.cfg.Source, src, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Checks++
	switch {
	case err != nil:
		c.stats.CheckErrors++
		if errors.Is(err, context.Canceled) {
			return nil, false
		}
		c.cfg.Logger.Warn("relay alarm check failed; retrying", "source", string(src), "err", err)
		return &pend{due: now.UnixMilli() + retryAfterError.Milliseconds(), kind: p.kind}, false
	case chk.Fire(now.UnixMilli()):
		return nil, true
	case chk.Claim == nil:
		c.stats.SkippedDone++ // fired, cleared or re-armed for later elsewhere
		return nil, false
	}
	c.stats.SkippedClaimed++
	if p.kind == swept || chk.Operator {
		// Its holder may have died (a fire's claim) or re-arms nothing
		// (an operator's): look again when the claim lapses.
		return &pend{due: chk.RetryMS, kind: retried}, false
	}
	// A retry meeting a fire's live claim: its holder was alive after
	// the claim we waited for lapsed, and re-arms the source itself.
	return nil, false
}

// done ends src's run: a wake-up that arrived meanwhile, and next (when
// set), are scheduled. It needs c.mu.
func (c *Clock) done(src relaycore.Partition, next *pend) {
	delete(c.running, src)
	if d, ok := c.rerun[src]; ok {
		delete(c.rerun, src)
		c.schedule(src, d)
	}
	if next != nil {
		c.schedule(src, *next)
	}
}

// sweep fires the store's overdue durable alarms: the safety net.
func (c *Clock) sweep(ctx context.Context) { c.sweepAhead(ctx, 0) }

// sweepAhead is sweep that also schedules the alarms due within ahead ms,
// each at its due time (checked before it fires, as every swept one is).
func (c *Clock) sweepAhead(ctx context.Context, ahead int64) {
	if c.cfg.Index == nil {
		return
	}
	now := c.nowMS()
	due, err := c.cfg.Index.Due(ctx, now+ahead, c.cfg.SweepLimit)
	if err != nil && ctx.Err() != nil {
		return // Run is stopping: not a sweep that failed
	}
	found := 0
	c.mu.Lock()
	if err != nil {
		c.stats.SweepErrors++
	}
	for _, e := range due {
		if err != nil || e.Key != relaycore.KeyAlarm {
			continue
		}
		found++
		c.stats.SweepFound++
		if _, ok := c.dueOf[e.Partition]; ok || c.running[e.Partition] {
			continue // this clock has it in hand already
		}
		// Due now (or, looking ahead, when due), in this clock's own
		// order: clocks sweeping together start at different sources.
		c.schedule(e.Partition, pend{due: max(now, e.Due), kind: swept, order: c.sweepOrder(e.Partition)})
	}
	c.mu.Unlock()
	if err != nil {
		c.cfg.Logger.Warn("relay sweep failed", "err", err)
	}
	if c.cfg.ObserveSweep != nil {
		c.cfg.ObserveSweep(found, err)
	}
}

// sweepOrder ranks src among the sources one sweep found: a hash of this
// clock's replica name and src, a different order per replica. FNV-1a
// alone keeps names that differ in their last bytes (s10, s11, ...) in
// runs, so its sum goes through splitmix64's finalizer, which spreads
// every input bit over the whole word.
func (c *Clock) sweepOrder(src relaycore.Partition) uint64 {
	h := fnv.New64a()
	h.Write([]byte(c.cfg.Replica))
	h.Write([]byte{0})
	h.Write([]byte(src))
	z := h.Sum64()
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

type wake struct {
	source relaycore.Partition
	pend
}

type wakeHeap []wake

func (h wakeHeap) Len() int { return len(h) }
func (h wakeHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	if h[i].order != h[j].order {
		return h[i].order < h[j].order
	}
	return h[i].source < h[j].source
}
func (h wakeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)   { *h = append(*h, x.(wake)) }
func (h *wakeHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	return w
}
