// Package demo runs the embedded relay on a realistic workload and checks
// its own result: several sources with concurrent writers append rows for
// dozens of targets while an in-process alarm clock fires them; one target
// fails for a while and then recovers. At quiescence every target key must
// hold the value of its newest row (per source, keys are disjoint), every
// outbox must be empty, and every rh must cover its source's rows. A
// mismatch is an error: the demo is also an end-to-end check.
package demo

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/relaycore"
)

// Config sizes the workload. Zero fields get the defaults in Defaults.
type Config struct {
	Plan           string // free | paid
	Sources        int    // sources (each with WritersPerSource writers)
	Targets        int    // targets shared by all sources
	RowsPerSource  int    // rows each source enqueues in total
	BatchRows      int    // rows per Enqueue call
	WritersPerSrc  int    // concurrent writers per source (os CAS races)
	ValueBytes     int    // bytes per row value
	FailingTarget  bool   // one target fails its first FailAttempts applies
	FailAttempts   int
	Seed           uint64
	ProgressPeriod time.Duration
	// WriteInterval paces each writer between batches so appends keep
	// landing while fires drain (0 = as fast as possible).
	WriteInterval time.Duration
}

// Defaults is the workload `make run` runs.
var Defaults = Config{
	Plan:           "free",
	Sources:        4,
	Targets:        40,
	RowsPerSource:  2000,
	BatchRows:      50,
	WritersPerSrc:  2,
	ValueBytes:     200,
	FailingTarget:  true,
	FailAttempts:   12,
	Seed:           1,
	ProgressPeriod: 500 * time.Millisecond,
	WriteInterval:  20 * time.Millisecond,
}

func (c Config) withDefaults() Config {
	d := Defaults
	if c.Plan == "" {
		c.Plan = d.Plan
	}
	for _, f := range []struct {
		v *int
		d int
	}{
		{&c.Sources, d.Sources}, {&c.Targets, d.Targets}, {&c.RowsPerSource, d.RowsPerSource},
		{&c.BatchRows, d.BatchRows}, {&c.WritersPerSrc, d.WritersPerSrc}, {&c.ValueBytes, d.ValueBytes},
		{&c.FailAttempts, d.FailAttempts},
	} {
		if *f.v <= 0 {
			*f.v = f.d
		}
	}
	if c.ProgressPeriod <= 0 {
		c.ProgressPeriod = d.ProgressPeriod
	}
	return c
}

// Stores are the two tables the demo runs on.
type Stores struct {
	Source, Target relaycore.Store
	// Index lists overdue alarms (the source store's DueIndex).
	Index relaycore.DueIndex
	// Name describes the backend in the summary ("bolt:/path", "dynamo:URL").
	Name string
	// Units, when set, reports the write and read capacity units both
	// tables consumed so far (DynamoDB's formulas; see docs/dynamodb.md).
	Units func() (write, read float64)
	// Transient, when set, tells which store errors the demo's own calls
	// (its writers' enqueues and its checks) repeat after a back-off
	// rather than give up on: DynamoDB's stores give up after a few
	// throttled attempts, which says nothing about the relay. Nil: none.
	Transient func(error) bool
	// Faults, when set, reports the faults injected into the store so far.
	Faults func() (throttled, dropped int64)
}

// Summary is what the demo reports (and prints as JSON with --json).
type Summary struct {
	Store            string  `json:"store"`
	Plan             string  `json:"plan"`
	Seed             uint64  `json:"seed"`
	Sources          int     `json:"sources"`
	Targets          int     `json:"targets"`
	RowsEnqueued     int64   `json:"rows_enqueued"`
	EnqueueBatches   int64   `json:"enqueue_batches"`
	EnqueueReplans   int64   `json:"enqueue_replans"`
	RowsDelivered    int64   `json:"rows_delivered"`
	Alarms           int64   `json:"alarms"`
	Fires            int64   `json:"fires"`
	Kicks            int64   `json:"kicks"`
	TargetCalls      int64   `json:"target_calls"`
	TargetFailures   int64   `json:"target_failures"`
	BlockedEvents    int64   `json:"blocked_events"`
	SourceStoreCalls int64   `json:"source_store_calls"`
	TargetStoreCalls int64   `json:"target_store_calls"`
	LagP50MS         int64   `json:"lag_p50_ms"`
	LagP99MS         int64   `json:"lag_p99_ms"`
	LagMaxMS         int64   `json:"lag_max_ms"`
	ElapsedMS        int64   `json:"elapsed_ms"`
	RowsPerSecond    float64 `json:"rows_per_second"`
	WriteUnitsPerRow float64 `json:"write_units_per_row,omitempty"`
	ReadUnitsPerRow  float64 `json:"read_units_per_row,omitempty"`
	// InjectedThrottles and InjectedDrops count the faults injected into
	// the store's requests; DemoRetries the demo's own calls it repeated.
	InjectedThrottles int64 `json:"injected_throttles,omitempty"`
	InjectedDrops     int64 `json:"injected_drops,omitempty"`
	DemoRetries       int64 `json:"demo_retries,omitempty"`
	Verified          bool  `json:"verified"`
	// Error is why the run stopped or failed its checks; empty when
	// Verified.
	Error string `json:"error,omitempty"`
}

// Run executes the workload to quiescence, writing progress lines to
// progress (may be io.Discard), and verifies the final state. The summary
// describes the run also when Run returns an error (then it is not
// Verified and says why in Error).
func Run(ctx context.Context, cfg Config, stores Stores, progress io.Writer, logger *slog.Logger) (Summary, error) {
	cfg = cfg.withDefaults()
	budget, err := relaycore.PlanBudget(cfg.Plan)
	if err != nil {
		return Summary{Store: stores.Name, Plan: cfg.Plan, Seed: cfg.Seed, Error: err.Error()}, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	src := relaycore.NewCountingStore(stores.Source)
	failing := relaycore.Partition("")
	if cfg.FailingTarget {
		failing = targetName(cfg.Targets / 2)
	}
	flaky := &flakyStore{Store: stores.Target, target: failing, failures: int64(cfg.FailAttempts)}
	dst := relaycore.NewCountingStore(flaky)

	lags := &lagRecorder{}
	retry := &retrier{transient: stores.Transient}
	var fires, rowsDelivered, targetCalls, blocked atomic.Int64
	h := &relaycore.RelayHandler{
		Source: src, Target: dst, Budget: budget, Logger: logger,
		Hook:        lags,
		BackoffBase: 50 * time.Millisecond, BackoffMax: 2 * time.Second,
	}
	ac := alarmclock.New(alarmclock.Config{
		Handler: h, Index: stores.Index, Workers: 4, SweepInterval: 5 * time.Second, Logger: logger,
		Observe: func(_ relaycore.Partition, r relaycore.AlarmResult, _ error) {
			fires.Add(int64(r.Fires))
			rowsDelivered.Add(int64(r.RowsDelivered))
			targetCalls.Add(int64(r.TargetCalls))
			blocked.Add(int64(r.TargetsBlock))
		},
	})
	h.Kicker = ac

	runCtx, stopClock := context.WithCancel(ctx)
	clockDone := make(chan error, 1)
	go func() { clockDone <- ac.Run(runCtx) }()
	defer func() { stopClock(); <-clockDone }()

	start := time.Now()
	// Writers commit with an idempotency key per batch, so a batch whose
	// outcome the store could not tell can be committed again safely; the
	// run id keeps keys of runs on reused tables apart.
	runID := crand.Text()[:10]
	model := newModel()
	var enqueued, batches, replans atomic.Int64
	// Writers stop and are waited for before Run returns, also on an
	// error: none may touch the stores once the caller closes them.
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWriters(); wg.Wait() }()
	errs := make(chan error, cfg.Sources*cfg.WritersPerSrc)
	for si := range cfg.Sources {
		source := relaycore.Partition(fmt.Sprintf("src-%02d", si))
		for wi := range cfg.WritersPerSrc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(cfg.Seed, uint64(si*1000+wi)))
				w := writer{cfg: cfg, source: source, writer: wi, rng: rng}
				for batch := 0; ; batch++ {
					rows := w.next()
					if rows == nil {
						return
					}
					opts := relaycore.EnqueueOptions{IdempotencyKey: fmt.Sprintf("demo:%s:%s:w%d:b%d", runID, source, wi, batch)}
					var res relaycore.CommitResult
					err := retry.do(wctx, func() error {
						var err error
						res, err = h.Enqueue(wctx, source, rows, opts)
						if errors.Is(err, relaycore.ErrIdempotentRequestTooLarge) {
							// The rows need several store batches, which
							// an idempotency record cannot cover.
							opts.IdempotencyKey = ""
							res, err = h.Enqueue(wctx, source, rows, opts)
						}
						return err
					}, func(err error) bool { return opts.IdempotencyKey != "" || !relaycore.MayBeApplied(err) })
					if err != nil {
						errs <- fmt.Errorf("enqueue %s: %w", source, err)
						return
					}
					model.record(source, rows, res.Seqs)
					enqueued.Add(int64(len(rows)))
					batches.Add(int64(res.Batches))
					replans.Add(int64(res.Replans))
					if cfg.WriteInterval > 0 {
						select {
						case <-time.After(cfg.WriteInterval):
						case <-wctx.Done():
							return
						}
					}
				}
			}()
		}
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	tick := time.NewTicker(cfg.ProgressPeriod)
	defer tick.Stop()
	sources := make([]relaycore.Partition, cfg.Sources)
	for i := range sources {
		sources[i] = relaycore.Partition(fmt.Sprintf("src-%02d", i))
	}
	finish := func(err error) (Summary, error) {
		s := summarize(cfg, stores, start, enqueued.Load(), batches.Load(), replans.Load(), rowsDelivered.Load(),
			fires.Load(), targetCalls.Load(), blocked.Load(), flaky.failed.Load(), ac.Stats(), src, dst, lags)
		s.DemoRetries = retry.retries.Load()
		if err != nil {
			s.Error = err.Error()
		}
		return s, err
	}
	report := func(phase string) {
		fmt.Fprintf(progress, "%-9s %6.1fs  enqueued %7d  delivered %7d  fires %5d  alarms %5d  blocked %3d  target failures %d\n",
			phase, time.Since(start).Seconds(), enqueued.Load(), rowsDelivered.Load(), fires.Load(),
			ac.Stats().Alarms, blocked.Load(), flaky.failed.Load())
	}
	writing := true
	for {
		select {
		case err := <-errs:
			return finish(err)
		case <-ctx.Done():
			return finish(ctx.Err())
		case <-writersDone:
			writersDone = nil
			writing = false
			report("written")
		case <-tick.C:
			if writing {
				report("running")
				continue
			}
			empty, err := allEmpty(ctx, retry, src, sources)
			if err != nil {
				return finish(fmt.Errorf("check outboxes: %w", err))
			}
			if empty && ac.Idle() {
				report("quiescent")
				goto done
			}
			report("draining")
		}
	}
done:
	// The figures (elapsed, rows/s, store calls) stop at quiescence: the
	// check below reads every target key, which on DynamoDB through the
	// fault injection took 10-70 s more.
	sum, _ := finish(nil)
	if err := model.verify(ctx, retry, stores.Target); err != nil {
		err = fmt.Errorf("verify: %w", err)
		sum.Error = err.Error()
		return sum, err
	}
	sum.Verified = true
	return sum, nil
}

// summarize describes the run so far.
func summarize(cfg Config, stores Stores, start time.Time, enqueued, batches, replans, delivered, fires, targetCalls, blocked, failed int64,
	st alarmclock.Stats, src, dst *relaycore.CountingStore, lags *lagRecorder) Summary {
	elapsed := time.Since(start)
	s := Summary{
		Store: stores.Name, Plan: cfg.Plan, Seed: cfg.Seed, Sources: cfg.Sources, Targets: cfg.Targets,
		RowsEnqueued: enqueued, EnqueueBatches: batches, EnqueueReplans: replans,
		RowsDelivered: delivered, Alarms: st.Alarms, Fires: fires, Kicks: st.Kicks,
		TargetCalls: targetCalls, TargetFailures: failed, BlockedEvents: blocked,
		SourceStoreCalls: src.Gets.Load() + src.GetManys.Load() + src.Scans.Load() + src.Applies.Load(),
		TargetStoreCalls: dst.Gets.Load() + dst.GetManys.Load() + dst.Scans.Load() + dst.Applies.Load(),
		ElapsedMS:        elapsed.Milliseconds(),
	}
	s.LagP50MS, s.LagP99MS, s.LagMaxMS = lags.percentiles()
	if elapsed > 0 {
		s.RowsPerSecond = float64(s.RowsDelivered) / elapsed.Seconds()
	}
	if stores.Units != nil && s.RowsEnqueued > 0 {
		w, r := stores.Units()
		s.WriteUnitsPerRow, s.ReadUnitsPerRow = w/float64(s.RowsEnqueued), r/float64(s.RowsEnqueued)
	}
	if stores.Faults != nil {
		s.InjectedThrottles, s.InjectedDrops = stores.Faults()
	}
	return s
}

// retrier repeats the demo's own store calls after the failures its
// Transient func names, with a capped exponential back-off, so a check
// rides out throttling the relay itself rides out by retrying alarms.
type retrier struct {
	transient func(error) bool
	retries   atomic.Int64
}

// maxDemoAttempts bounds one call's attempts; each attempt is a store call
// with its own retries, so giving up means the store is down, not busy.
const maxDemoAttempts = 12

// do runs call until it succeeds, fails for good, or runs out of
// attempts. safe, when set, must also hold for an error to be retried.
func (r *retrier) do(ctx context.Context, call func() error, safe func(error) bool) error {
	backoff := 20 * time.Millisecond
	for n := 1; ; n++ {
		err := call()
		if err == nil || r.transient == nil || !r.transient(err) || safe != nil && !safe(err) || n >= maxDemoAttempts {
			return err
		}
		r.retries.Add(1)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

func targetName(i int) relaycore.Partition { return relaycore.Partition(fmt.Sprintf("tgt-%03d", i)) }

func allEmpty(ctx context.Context, retry *retrier, st relaycore.Store, sources []relaycore.Partition) (bool, error) {
	for _, s := range sources {
		var state relaycore.SourceState
		err := retry.do(ctx, func() error {
			var err error
			state, err = relaycore.SourceRelayState(ctx, st, s, time.Now())
			return err
		}, nil)
		if err != nil {
			return false, err
		}
		if !state.Empty {
			return false, nil
		}
	}
	return true, nil
}

// writer produces one writer's batches: rows over the targets, with keys
// owned by (source, writer) so puts and deletes have exactly one producer.
type writer struct {
	cfg    Config
	source relaycore.Partition
	writer int
	rng    *rand.Rand
	sent   int
}

func (w *writer) next() []relaycore.Row {
	quota := w.cfg.RowsPerSource / w.cfg.WritersPerSrc
	if w.writer == 0 {
		quota += w.cfg.RowsPerSource % w.cfg.WritersPerSrc
	}
	n := min(w.cfg.BatchRows, quota-w.sent)
	if n <= 0 {
		return nil
	}
	rows := make([]relaycore.Row, n)
	for i := range rows {
		t := targetName(w.rng.IntN(w.cfg.Targets))
		key := fmt.Sprintf("%s/w%d/k%03d", w.source, w.writer, w.rng.IntN(64))
		if w.rng.IntN(10) == 0 {
			rows[i] = relaycore.Row{Target: t, Deletes: []string{key}}
			continue
		}
		v := make([]byte, w.cfg.ValueBytes)
		for j := range v {
			v[j] = 'a' + byte(w.rng.IntN(26))
		}
		rows[i] = relaycore.Row{Target: t, Puts: []relaycore.KV{{Key: key, Value: v}}}
	}
	w.sent += n
	return rows
}

// model is the expected final state: per (target, key), the newest row's
// effect by (source) seq. Keys are owned by one (source, writer), so seq
// order within the source orders every write of a key.
type model struct {
	mu   sync.Mutex
	last map[relaycore.Partition]map[string]modelWrite
}

type modelWrite struct {
	seq   uint64
	value []byte // nil = deleted
}

func newModel() *model { return &model{last: map[relaycore.Partition]map[string]modelWrite{}} }

func (m *model) record(_ relaycore.Partition, rows []relaycore.Row, seqs []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, r := range rows {
		km := m.last[r.Target]
		if km == nil {
			km = map[string]modelWrite{}
			m.last[r.Target] = km
		}
		for _, kv := range r.Puts {
			if w, ok := km[kv.Key]; !ok || w.seq < seqs[i] {
				km[kv.Key] = modelWrite{seq: seqs[i], value: kv.Value}
			}
		}
		for _, k := range r.Deletes {
			if w, ok := km[k]; !ok || w.seq < seqs[i] {
				km[k] = modelWrite{seq: seqs[i]}
			}
		}
	}
}

func (m *model) verify(ctx context.Context, retry *retrier, st relaycore.Store) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var problems []error
	for target, keys := range m.last {
		for k, w := range keys {
			var (
				v     []byte
				found bool
			)
			err := retry.do(ctx, func() error {
				var err error
				v, found, err = st.Get(ctx, target, k)
				return err
			}, nil)
			if err != nil {
				return err
			}
			switch {
			case w.value == nil && found:
				problems = append(problems, fmt.Errorf("%s/%s: deleted row's key still present", target, k))
			case w.value != nil && !found:
				problems = append(problems, fmt.Errorf("%s/%s: missing", target, k))
			case w.value != nil && string(v) != string(w.value):
				problems = append(problems, fmt.Errorf("%s/%s: stale value", target, k))
			}
			if len(problems) > 10 {
				return errors.Join(problems...)
			}
		}
	}
	return errors.Join(problems...)
}

// flakyStore injects failures into one target's applies: the demo's
// "failing target that recovers". It wraps a real store.
type flakyStore struct {
	relaycore.Store
	target   relaycore.Partition
	failures int64
	failed   atomic.Int64
}

var errTargetDown = errors.New("target unavailable (injected by the demo)")

// flakyStore passes batch reads through, so wrapping a store does not
// turn its GetMany back into one Get per key.
var _ relaycore.BatchGetter = (*flakyStore)(nil)

// GetMany implements relaycore.BatchGetter by passing through.
func (f *flakyStore) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	return relaycore.GetMany(ctx, f.Store, p, keys)
}

func (f *flakyStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if p == f.target && f.takeFailure() {
		return errTargetDown
	}
	return f.Store.Apply(ctx, p, b)
}

// takeFailure claims one of the failures to inject, if any is left. The
// check and the count are one compare-and-swap: a Load, then an Add let
// two concurrent applies both see the last failure left and inject one
// more than asked (TestDemoDrainsAndVerifies saw 6 of 5).
func (f *flakyStore) takeFailure() bool {
	for {
		n := f.failed.Load()
		if n >= f.failures {
			return false
		}
		if f.failed.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// lagRecorder is a RelayHook that adds nothing and records, for each row an
// apply attempt carries, how long ago it was committed.
type lagRecorder struct {
	mu   sync.Mutex
	lags []int64
}

func (l *lagRecorder) BeforeApply(_ context.Context, req relaycore.HookRequest) ([]relaycore.Write, error) {
	now := time.Now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range req.Rows {
		l.lags = append(l.lags, max(0, now-r.CommitMS))
	}
	return nil, nil
}

func (l *lagRecorder) percentiles() (p50, p99, most int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lags) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(l.lags)
	slices.Sort(s)
	at := func(q float64) int64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.99), s[len(s)-1]
}
