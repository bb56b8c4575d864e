package relayapi

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
)

// Store is what the agent reads of the segment store (*segstore.Store).
type Store interface {
	// ListAfter pages through the index in id order; Stat reads one
	// entry (segstore.ErrNotFound if absent).
	ListAfter(after string, limit int) ([]segstore.Entry, error)
	Stat(id string) (segstore.Entry, error)
	// TombstoneOf returns a taken-down segment's tombstone, or
	// segstore.ErrNotFound.
	TombstoneOf(id string) (segstore.Tombstone, error)
	// EachReceiptKey walks the stored receipts' (segment, request) keys;
	// Receipt reads one (segstore.ErrNotFound if absent).
	EachReceiptKey(fn func(id, request string) error) error
	Receipt(id, request string) ([]byte, error)
}

// Evict takes a segment down for a request (daemon.Daemon.Takedown): it
// reports whether this call removed it. segstore.ErrNotFound means the
// node neither holds nor took down the segment (nothing signed); any
// other error leaves the order to be asked again. It must be idempotent.
type Evict func(segment, request string) (evicted bool, err error)

// Options are the agent's dependencies.
type Options struct {
	Node   string          // this node's id
	Config config.RelayAPI // Enabled
	// HTTP is the client (NewHTTPClient); Sign, if set, signs each
	// request (NewSigV4).
	HTTP *http.Client
	Sign Signer
	DB   *bolt.DB // edged.db: the agent's buckets live beside the store's
	// Store and Evict are the segment store and the daemon's Takedown.
	Store Store
	Evict Evict
	// Registerer receives the agent's Prometheus metrics; nil: none.
	Registerer prometheus.Registerer
	Log        *slog.Logger
	Now        func() time.Time // default time.Now
	UserAgent  string           // default "edged"
}

// Agent runs the three jobs (see the package doc).
type Agent struct {
	cfg   config.RelayAPI
	node  string
	db    *bolt.DB
	store Store
	evict Evict
	api   *client
	log   *slog.Logger
	now   func() time.Time
	met   *metrics
	// spread scales every wait of this node (see the package doc).
	spread float64
	// batch is the holdings batch size: relay_api.batch, halved after
	// each 413 (the relay's bound on one request is lower). The holdings
	// job's alone.
	batch int

	holdings, orders, receipts             *jobState
	holdingsKick, ordersKick, receiptsKick chan struct{}

	// stored holds the ids committed since the holdings job took them
	// (Stored): a pass a store started compares only those. walk says a
	// whole walk of the index is owed before that shortcut holds again (a
	// takedown, a failed pass: changes no store signalled).
	storedMu sync.Mutex
	stored   map[string]struct{}
	walk     atomic.Bool
}

// Job names (the label of edged_relayapi_requests_total).
const (
	jobHoldings = "holdings"
	jobOrders   = "orders"
	jobReceipts = "receipts"
)

// New creates the agent's buckets in DB (and, in a database new to them,
// its idempotency key epoch). It sends nothing before Run.
func New(o Options) (*Agent, error) {
	if !o.Config.Enabled() {
		return nil, errors.New("relayapi: relay_api.url is not set")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.UserAgent == "" {
		o.UserAgent = "edged"
	}
	if err := initState(o.DB); err != nil {
		return nil, fmt.Errorf("relayapi: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte(o.Node))
	a := &Agent{
		cfg: o.Config, node: o.Node, db: o.DB, store: o.Store, evict: o.Evict,
		api: &client{base: strings.TrimRight(o.Config.URL, "/"), http: o.HTTP, sign: o.Sign, userAgent: o.UserAgent},
		log: o.Log.With("component", "relay_api"), now: o.Now, met: newMetrics(o.Registerer),
		spread: 1 - float64(h.Sum64()%1000)/4000, batch: o.Config.Batch,
		holdings: newJobState(), orders: newJobState(), receipts: newJobState(),
		holdingsKick: make(chan struct{}, 1), ordersKick: make(chan struct{}, 1), receiptsKick: make(chan struct{}, 1),
		stored: map[string]struct{}{},
	}
	c, err := a.cursor()
	if err != nil {
		return nil, fmt.Errorf("relayapi: %w", err)
	}
	a.orders.setCursor(c)
	return a, nil
}

// Run runs the jobs until ctx ends. Each starts at once: a node back from
// a long time offline reports, pulls and posts in its first seconds.
func (a *Agent) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, j := range []struct {
		name          string
		st            *jobState
		kick          chan struct{}
		interval, gap time.Duration
		pass          func(ctx context.Context, kicked bool) error
	}{
		// Holdings are reported at the interval, and soon after a store
		// or a takedown (kicked), kicked passes at least report_delay
		// apart.
		{jobHoldings, a.holdings, a.holdingsKick, a.cfg.ReportInterval, a.cfg.ReportDelay, a.reportPass},
		{jobOrders, a.orders, a.ordersKick, a.cfg.OrderInterval, 0, func(ctx context.Context, _ bool) error { return a.orderPass(ctx) }},
		// Receipts are posted as orders are applied (kicked), and swept at
		// the report interval for those signed otherwise (edgectl
		// takedown evict) or refused by a restart.
		{jobReceipts, a.receipts, a.receiptsKick, a.cfg.ReportInterval, 0, func(ctx context.Context, _ bool) error { return a.receiptPass(ctx) }},
	} {
		wg.Go(func() { a.loop(ctx, j.name, j.st, j.kick, j.interval, j.gap, j.pass) })
	}
	wg.Wait()
}

// Changed says the store changed (a takedown, an eviction): the holdings
// and receipt jobs run soon, unless they are backing off.
func (a *Agent) Changed() {
	a.walk.Store(true)
	a.kick(a.holdingsKick)
	a.kick(a.receiptsKick)
}

// Stored says segment id was stored (segstore.Options.OnCommit): the
// holdings job reports it within relay_api.report_delay, not at the next
// report_interval, unless it is backing off, so that the owner of a
// takedown requested meanwhile sees a late holder (issue 23) in seconds.
// Stores in a burst, or one after another, share a pass: the kick is a
// flag, and kicked passes are report_delay apart; such a pass compares
// only the ids stored since the last one, not the whole index. It never
// blocks.
func (a *Agent) Stored(id string) {
	if a.cfg.ReportDelay <= 0 {
		return
	}
	a.storedMu.Lock()
	if len(a.stored) < maxStored {
		a.stored[id] = struct{}{}
	} else {
		// A relay out of reach for long while stores go on: a walk
		// finds them all, and the set stays small.
		clear(a.stored)
		a.walk.Store(true)
	}
	a.storedMu.Unlock()
	a.kick(a.holdingsKick)
}

// maxStored bounds the ids Stored keeps between passes (about 100 bytes
// each): past it the next pass walks the index instead.
const maxStored = 4096

// takeStored empties the set of ids stored, in id order.
func (a *Agent) takeStored() []string {
	a.storedMu.Lock()
	defer a.storedMu.Unlock()
	ids := make([]string, 0, len(a.stored))
	for id := range a.stored {
		ids = append(ids, id)
	}
	clear(a.stored)
	slices.Sort(ids)
	return ids
}

func (a *Agent) kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop runs pass, then waits: the interval after a success, or after a
// refusal (a 4xx: asking again at once would get the same answer), the
// back-off after a retryable failure. A kick ends an interval early, never
// a back-off, and the pass it starts begins at least gap after the one
// before began, or at the interval if that comes first (kicks meanwhile
// are one).
func (a *Agent) loop(ctx context.Context, name string, st *jobState, kick chan struct{}, interval, gap time.Duration, pass func(ctx context.Context, kicked bool) error) {
	failures, kicked := 0, false
	for ctx.Err() == nil {
		began := time.Now()
		st.beginPass()
		err := pass(ctx, kicked)
		kicked = false
		if ctx.Err() != nil {
			return
		}
		wait := a.scaled(interval)
		switch {
		case err == nil:
			failures = 0
			// Only a pass the relay answered is a success: one that had
			// nothing to send asked nothing, and says nothing about
			// whether the relay can be reached.
			if st.succeeded(a.now()) {
				a.met.lastSuccess.WithLabelValues(name).Set(float64(a.now().UnixMilli()) / 1000)
			}
		case retryable(err):
			failures++
			wait = a.backoff(failures)
			a.log.Warn("relay API request failed; retrying", "job", name, "attempt", failures, "retry_in", wait, "err", err)
			st.failed(a.now(), err, failures, a.now().Add(wait))
		default:
			failures = 0
			a.log.Error("relay API refused a request", "job", name, "err", err)
			st.failed(a.now(), err, 0, a.now().Add(wait))
		}
		t := time.NewTimer(wait)
		var kickCh <-chan struct{}
		if failures == 0 {
			kickCh = kick
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kickCh:
			// Not before gap after the last pass began, nor later than
			// the interval would have run it.
			kicked = true
			if d := gap - time.Since(began); d > 0 {
				g := time.NewTimer(d)
				select {
				case <-ctx.Done():
					g.Stop()
					t.Stop()
					return
				case <-g.C:
				case <-t.C:
					kicked = false
				}
				g.Stop()
			}
			t.Stop()
		case <-t.C:
		}
	}
}

// backoff is the wait after the n-th failure in a row.
func (a *Agent) backoff(n int) time.Duration {
	d := a.cfg.Backoff.Initial
	for i := 1; i < n && d < a.cfg.Backoff.Max; i++ {
		d *= 2
	}
	return a.scaled(min(d, a.cfg.Backoff.Max))
}

func (a *Agent) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * a.spread)
}

// call is client.do bounded by relay_api.timeout.
func (a *Agent) call(ctx context.Context, method, path string, h http.Header, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	return a.api.do(ctx, method, path, h, body, out)
}

// request counts one request of job's, and notes in st that the relay
// answered (ok or a 4xx refusal) unless it failed.
func (a *Agent) request(st *jobState, job string, err error) {
	o := outcome(err)
	a.met.requests.WithLabelValues(job, o).Inc()
	st.answer(o != "failed")
}

// outcome labels a request's result.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case retryable(err):
		return "failed"
	}
	return "refused"
}

// Status is the agent's part of the status RPC.
func (a *Agent) Status() rpc.RelayAPI {
	return rpc.RelayAPI{
		URL: a.cfg.URL, Auth: a.cfg.Auth,
		Holdings: a.holdings.status(), Orders: a.orders.status(), Receipts: a.receipts.status(),
		Cursor: a.orders.cursorNow(),
	}
}

func (a *Agent) setReceiptsPending(n int) {
	a.receipts.setPending(n)
	a.met.receiptsPending.Set(float64(n))
}

// jobState is one job's figures for the status RPC.
type jobState struct {
	mu          sync.Mutex
	counts      map[string]int64
	pending     int
	lastSuccess time.Time
	lastError   string
	lastErrorAt time.Time
	failures    int
	next        time.Time
	cursor      string

	lastRefusal   string
	lastRefusalAt time.Time

	// replied is set when the relay answered a request of the pass
	// under way; passes counts the passes ended.
	replied bool
	passes  int
}

func newJobState() *jobState { return &jobState{counts: map[string]int64{}} }

func (s *jobState) note(result string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[result]++
}

// refused counts a request the relay refused for good (a 4xx) that did
// not fail the pass: a receipt.
func (s *jobState) refused(at time.Time, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts["refused"]++
	s.lastRefusal, s.lastRefusalAt = what, at
}

func (s *jobState) sent(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts["sent"] += int64(n)
}

func (s *jobState) setPending(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = n
}

func (s *jobState) setCursor(c string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cursor = c
}

func (s *jobState) cursorNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

func (s *jobState) answer(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replied = s.replied || ok
}

// beginPass starts a pass: no answer from the relay yet.
func (s *jobState) beginPass() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replied = false
}

// succeeded ends a pass without an error at at. It is the job's last
// success, and reported true, only if the relay answered one of its
// requests: a pass with nothing to send is not.
func (s *jobState) succeeded(at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures, s.next = 0, time.Time{}
	s.passes++
	if !s.replied {
		return false
	}
	s.lastSuccess = at
	return true
}

func (s *jobState) failed(at time.Time, err error, failures int, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastError, s.lastErrorAt, s.failures, s.next = err.Error(), at, failures, next
	s.passes++
}

func (s *jobState) passesEnded() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.passes
}

func (s *jobState) status() rpc.RelayAPIJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := rpc.RelayAPIJob{Counts: maps.Clone(s.counts), Pending: s.pending, LastError: s.lastError, Failures: s.failures, Passes: s.passes}
	if !s.lastSuccess.IsZero() {
		t := s.lastSuccess
		j.LastSuccess = &t
	}
	if !s.lastErrorAt.IsZero() {
		t := s.lastErrorAt
		j.LastErrorAt = &t
	}
	if !s.lastRefusalAt.IsZero() {
		t := s.lastRefusalAt
		j.LastRefusal, j.LastRefusalAt = s.lastRefusal, &t
	}
	if s.failures > 0 {
		t := s.next
		j.NextAttempt = &t
	}
	return j
}

// metrics are the agent's Prometheus series.
type metrics struct {
	requests        *prometheus.CounterVec
	reported        *prometheus.CounterVec
	orders          *prometheus.CounterVec
	receipts        *prometheus.CounterVec
	holdingsPending prometheus.Gauge
	receiptsPending prometheus.Gauge
	lastSuccess     *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relayapi_requests_total", Help: "Requests to the relay API (relay_api), by job (holdings, orders, receipts) and result (ok; failed: no answer or a 5xx, retried with back-off; refused: a 4xx, not retried as is).",
		}, []string{"job", "result"}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relayapi_holdings_reported_total", Help: "Holdings reports the relay accepted, by state (held, evicted).",
		}, []string{"state"}),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relayapi_orders_total", Help: "Takedown orders handled, by result (evicted; receipt: taken down before; not_held: this node neither holds nor took down the segment, nothing signed; invalid: malformed, nothing done).",
		}, []string{"result"}),
		receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relayapi_receipts_total", Help: "Takedown receipts posted, by the relay's verdict (accepted, replayed: accepted before, refused: a 4xx, not posted again).",
		}, []string{"result"}),
		holdingsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edged_relayapi_holdings_pending", Help: "Holdings reports owed to the relay (segments stored or evicted here that it has not been told of), as counted by the last pass that walked the whole index (at start, every report_interval, after a takedown or a failed pass); passes a store started do not recount it. 0 once the relay knows what this node holds.",
		}),
		receiptsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edged_relayapi_receipts_pending", Help: "Stored takedown receipts without the relay's verdict at the last pass.",
		}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edged_relayapi_last_success_timestamp_seconds", Help: "When each job (holdings, orders, receipts) last finished a pass without an error in which the relay answered its requests, in Unix seconds; a pass with nothing to send does not count. orders asks the relay every pass: alert on its series to see the relay unreachable.",
		}, []string{"job"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.reported, m.orders, m.receipts, m.holdingsPending, m.receiptsPending, m.lastSuccess)
	}
	return m
}
