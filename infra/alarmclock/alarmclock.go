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
// source waits out the claim, not the sweep.
package alarmclock

import (
	"container/heap"
	"context"
	"errors"
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
	// Workers bounds concurrent alarms (default 4).
	Workers int
	// SweepInterval is the safety-net period (default 1 minute, the
	// cloud sweep's rate).
	SweepInterval time.Duration
	// SweepLimit bounds alarms fired per sweep (default 256).
	SweepLimit int
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
	pending wakeHeap                      // due wake-ups, earliest first
	dueOf   map[relaycore.Partition]int64 // earliest pending due per source
	running map[relaycore.Partition]bool  // sources with an alarm in progress
	rerun   map[relaycore.Partition]int64 // kicks that arrived while running
	changed chan struct{}                 // wakes Run when the heap changes
	stats   Stats
}

// Stats counts the clock's work.
type Stats struct {
	Kicks, Alarms, SweepFound, Errors int64
	// SweepErrors counts sweeps that could not list the due index.
	SweepErrors int64
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Clock{
		cfg:     cfg,
		dueOf:   map[relaycore.Partition]int64{},
		running: map[relaycore.Partition]bool{},
		rerun:   map[relaycore.Partition]int64{},
		changed: make(chan struct{}, 1),
	}
}

// Kick implements relaycore.Kicker: wake source's alarm at dueMS. Kicks for
// a source collapse to the earliest pending one. It never fails.
func (c *Clock) Kick(_ context.Context, source relaycore.Partition, dueMS int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Kicks++
	c.schedule(source, dueMS)
	return nil
}

// schedule needs c.mu.
func (c *Clock) schedule(source relaycore.Partition, dueMS int64) {
	if c.running[source] {
		if d, ok := c.rerun[source]; !ok || dueMS < d {
			c.rerun[source] = dueMS
		}
		return
	}
	if d, ok := c.dueOf[source]; ok && d <= dueMS {
		return
	}
	c.dueOf[source] = dueMS
	heap.Push(&c.pending, wake{source: source, due: dueMS})
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
		if c.dueOf[w.source] != w.due {
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
	work := make(chan relaycore.Partition)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for src := range work {
				c.runAlarm(ctx, src)
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()

	sweep := time.NewTicker(c.cfg.SweepInterval)
	defer sweep.Stop()
	c.sweep(ctx)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		src, wait, ok := c.popDue(time.Now().UnixMilli())
		if ok {
			select {
			case work <- src:
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

// popDue takes the earliest due wake-up if it is due at nowMS, marking its
// source running; otherwise it says how long to wait.
func (c *Clock) popDue(nowMS int64) (relaycore.Partition, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending.Len() > 0 {
		w := c.pending[0]
		if c.dueOf[w.source] != w.due {
			heap.Pop(&c.pending)
			continue
		}
		if w.due > nowMS {
			return "", time.Duration(w.due-nowMS) * time.Millisecond, false
		}
		heap.Pop(&c.pending)
		delete(c.dueOf, w.source)
		c.running[w.source] = true
		return w.source, 0, true
	}
	return "", time.Hour, false
}

func (c *Clock) runAlarm(ctx context.Context, src relaycore.Partition) {
	res, err := c.cfg.Handler.Alarm(ctx, src)
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
	delete(c.running, src)
	if d, ok := c.rerun[src]; ok {
		delete(c.rerun, src)
		c.schedule(src, d)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// Storage trouble: try again soon rather than waiting a sweep.
		c.schedule(src, time.Now().Add(time.Second).UnixMilli())
	}
}

// sweep fires the store's overdue durable alarms: the safety net.
func (c *Clock) sweep(ctx context.Context) {
	if c.cfg.Index == nil {
		return
	}
	now := time.Now().UnixMilli()
	due, err := c.cfg.Index.Due(ctx, now, c.cfg.SweepLimit)
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
		c.schedule(e.Partition, e.Due)
	}
	c.mu.Unlock()
	if err != nil {
		c.cfg.Logger.Warn("relay sweep failed", "err", err)
	}
	if c.cfg.ObserveSweep != nil {
		c.cfg.ObserveSweep(found, err)
	}
}

type wake struct {
	source relaycore.Partition
	due    int64
}

type wakeHeap []wake

func (h wakeHeap) Len() int { return len(h) }
func (h wakeHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
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
