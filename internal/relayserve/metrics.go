package relayserve

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/relaycore"
)

// metrics are the server's Prometheus metrics: the signals the Lambda
// functions write as EMF metrics (lambda/metrics, docs/operations.md),
// plus HTTP request metrics. Per-source series have a source label, so
// their number grows with the number of sources (docs/serve.md).
type metrics struct {
	reg *prometheus.Registry

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	// idleClosed counts idle connections closed to make room at
	// limits.max_connections; handshakeErrors counts failed TLS
	// handshakes (logged in summary, see errorlog.go).
	idleClosed      prometheus.Counter
	handshakeErrors prometheus.Counter

	alarms          *prometheus.CounterVec
	rowsDelivered   *prometheus.CounterVec
	autoQuarantined *prometheus.CounterVec
	blocked         *prometheus.GaugeVec
	quarantined     *prometheus.GaugeVec
	paused          *prometheus.GaugeVec
	held            *prometheus.GaugeVec
	sweeps          prometheus.Counter
	sweepErrors     prometheus.Counter
	sweepOverdue    prometheus.Counter

	age *ageCollector
	// clock is set to the alarm clock's stats once it exists.
	clock *clockCollector

	// source is the store the age and the refresh read.
	source relaycore.Store
	// seen holds, for each source whose gauges this process exports, its
	// oldest undelivered commit time and when its gauges were last set;
	// mu guards it and the per-source gauges' presence (forget, refresh).
	mu   sync.Mutex
	seen map[relaycore.Partition]sourceSeen
}

// sourceSeen is what the per-source gauges keep beside their values: the
// oldest undelivered commit time (unix ms, 0: outbox empty), aged at
// scrape time once known, and when the gauges were last set, by an alarm
// here or a refresh (unix ms; 0: due for a refresh).
type sourceSeen struct {
	lowerMS, atMS int64
	known         bool // lowerMS was read: exported
}

func newMetrics(source relaycore.Store) *metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &metrics{reg: reg, source: source, seen: map[relaycore.Partition]sourceSeen{}}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_http_requests_total", Help: "HTTP requests answered, by route pattern, method and status code.",
	}, []string{"route", "method", "code"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "relay_http_request_duration_seconds", Help: "Time to answer an HTTP request, by route pattern and method.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
	}, []string{"route", "method"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relay_http_requests_in_flight", Help: "HTTP requests being served.",
	})
	m.idleClosed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_http_idle_connections_closed_total",
		Help: "Idle connections closed to make room for a new one at limits.max_connections (those that never carried an authenticated request first).",
	})
	m.handshakeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_tls_handshake_errors_total", Help: "TLS handshakes that failed (the log has one summary line per minute at most).",
	})
	m.alarms = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_alarms_total",
		Help: "Alarms run, by outcome: delivered (moved rows), idle (moved none), busy (another fire held the claim), failed.",
	}, []string{"outcome"})
	m.rowsDelivered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_rows_delivered_total", Help: "Rows newly applied at their targets, by source.",
	}, []string{"source"})
	m.autoQuarantined = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_targets_auto_quarantined_total", Help: "Targets quarantined by the engine for failing, by source.",
	}, []string{"source"})
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"source"})
	}
	m.blocked = gauge("relay_targets_blocked", "Targets in the source's blocked set after its last alarm.")
	m.quarantined = gauge("relay_targets_quarantined", "Quarantined targets of the source after its last alarm.")
	m.paused = gauge("relay_targets_paused", "Paused targets of the source after its last alarm.")
	m.held = gauge("relay_rows_held", "Rows held aside (quarantined, paused or retrying targets) after the source's last alarm.")
	m.sweeps = prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_sweeps_total", Help: "Sweeps of the due index run."})
	m.sweepErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_sweep_errors_total", Help: "Sweeps that could not list the due index (lost kicks stay unhealed while this grows).",
	})
	m.sweepOverdue = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_sweep_overdue_total", Help: "Overdue alarms the sweeps found and fired.",
	})
	m.age = &ageCollector{m: m, desc: prometheus.NewDesc(
		"relay_oldest_undelivered_age_seconds",
		"Now minus the commit time of the source's oldest undelivered row, held rows (quarantined, paused or retrying targets) included; 0 when nothing is undelivered. As of each alarm (and the refresh of sources alarmed elsewhere) and of the rows committed here since, aged at scrape time.",
		[]string{"source"}, nil)}
	m.clock = &clockCollector{}
	for _, c := range []prometheus.Collector{
		m.requests, m.duration, m.inFlight, m.idleClosed, m.handshakeErrors, m.alarms, m.rowsDelivered, m.autoQuarantined,
		m.blocked, m.quarantined, m.paused, m.held, m.sweeps, m.sweepErrors, m.sweepOverdue, m.age, m.clock,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		f(c)
	}
	for _, o := range []string{"delivered", "idle", "busy", "failed"} {
		m.alarms.WithLabelValues(o) // every outcome exists from the start, at 0
	}
	return m
}

// alarm records one alarm, as lambda/metrics.Recorder.Alarm does: a busy
// or failed alarm only counts; the others set the source's gauges.
func (m *metrics) alarm(ctx context.Context, src relaycore.Partition, r relaycore.AlarmResult, err error) {
	s := string(src)
	switch {
	case err != nil:
		m.alarms.WithLabelValues("failed").Inc()
		m.rowsDelivered.WithLabelValues(s).Add(float64(r.RowsDelivered))
		return
	case r.Busy:
		m.alarms.WithLabelValues("busy").Inc()
		// Another fire holds the source: with replicas, another process
		// fires it now, and its series are there. Ours would only go
		// stale (an age growing for rows delivered elsewhere).
		m.forget(src)
		return
	case r.RowsDelivered == 0 && r.RowsCleaned == 0:
		m.alarms.WithLabelValues("idle").Inc()
	default:
		m.alarms.WithLabelValues("delivered").Inc()
	}
	m.rowsDelivered.WithLabelValues(s).Add(float64(r.RowsDelivered))
	m.autoQuarantined.WithLabelValues(s).Add(float64(r.TargetsQuarantined))
	m.blocked.WithLabelValues(s).Set(float64(r.Blocked))
	m.quarantined.WithLabelValues(s).Set(float64(r.Hold.Quarantined))
	m.paused.WithLabelValues(s).Set(float64(r.Hold.Paused))
	m.held.WithLabelValues(s).Set(float64(r.Hold.HeldRows))
	// The oldest undelivered commit time: the bound the alarm's re-arm
	// read (held rows included, also when it cleared the outbox), else
	// none when it cleared the outbox with nothing held, else read here.
	next := sourceSeen{known: true, atMS: time.Now().UnixMilli()}
	if r.LowerBoundMS > 0 {
		next.lowerMS = r.LowerBoundMS
	} else if (!r.Cleared || r.Hold.HeldRows > 0) && m.source != nil {
		st, err := relaycore.SourceRelayState(ctx, m.source, src, time.Now())
		switch {
		case err != nil:
			// Keep the last age (the alarm's own error path logs store
			// trouble), and let the next refresh read it.
			next.known, next.atMS = false, 0
		case !st.Empty:
			next.lowerMS = st.LowerBoundMS
		}
	}
	m.mu.Lock()
	if prev := m.seen[src]; !next.known {
		next.lowerMS, next.known = prev.lowerMS, prev.known
	}
	m.seen[src] = next
	m.mu.Unlock()
}

// committed notes rows of src committed at nowMS through this server:
// when its gauges know of nothing undelivered, the oldest undelivered row
// is now one of these, so its age grows from here until an alarm (or a
// refresh) reads the store's bound. Without it a source whose fires
// cannot run (a database that takes enqueues and fails fires, an outage
// the refresh cannot read through) showed an age of 0 with rows waiting,
// and the documented alert never fired.
func (m *metrics) committed(src relaycore.Partition, nowMS int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.seen[src]; e.lowerMS == 0 || !e.known {
		e.lowerMS, e.known = nowMS, true
		m.seen[src] = e
	}
}

// refreshLimit bounds the sources one refresh reads (two reads each).
const refreshLimit = 256

// refresh re-reads, from the store, the gauges of up to refreshLimit
// sources whose gauges were last set before nowMS-staleMS, stalest first.
// A source's gauges are set by its alarms here, so without this they keep
// what the last one saw through whatever happens elsewhere: an operator
// action (a release, a quarantine of an idle target) through the API,
// here or on another replica, or the fires of another replica that the
// source moved to. The figures are the store's (AlarmResult reports the
// same ones after an alarm), so every replica that exports a source's
// gauges converges on them. A read that fails keeps the last values.
func (m *metrics) refresh(ctx context.Context, nowMS, staleMS int64) (read int) {
	if m.source == nil {
		return 0
	}
	type entry struct {
		src relaycore.Partition
		ms  int64
	}
	m.mu.Lock()
	var stale []entry
	for src, e := range m.seen {
		if e.atMS <= nowMS-staleMS {
			stale = append(stale, entry{src, e.atMS})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(stale, func(a, b entry) int { return cmp.Or(cmp.Compare(a.ms, b.ms), cmp.Compare(a.src, b.src)) })
	now := time.UnixMilli(nowMS)
	for _, e := range stale[:min(len(stale), refreshLimit)] {
		if ctx.Err() != nil {
			return read
		}
		state, err := relaycore.SourceRelayState(ctx, m.source, e.src, now)
		if err != nil {
			continue
		}
		chk, err := relaycore.CheckAlarm(ctx, m.source, e.src, now)
		if err != nil {
			continue
		}
		read++
		lower := int64(0)
		if !state.Empty {
			lower = state.LowerBoundMS
		}
		s := string(e.src)
		m.mu.Lock()
		if _, exported := m.seen[e.src]; exported {
			// Not dropped meanwhile (a busy alarm hands the source to
			// another replica, whose gauges are then the ones to read).
			m.blocked.WithLabelValues(s).Set(float64(chk.Blocked))
			m.quarantined.WithLabelValues(s).Set(float64(state.Hold.Quarantined))
			m.paused.WithLabelValues(s).Set(float64(state.Hold.Paused))
			m.held.WithLabelValues(s).Set(float64(state.Hold.HeldRows))
			m.seen[e.src] = sourceSeen{lowerMS: lower, atMS: nowMS, known: true}
		}
		m.mu.Unlock()
	}
	return read
}

// refreshLoop runs refresh every period for sources not refreshed or
// alarmed here for a period, until ctx ends.
func (m *metrics) refreshLoop(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.refresh(ctx, time.Now().UnixMilli(), period.Milliseconds())
		}
	}
}

// forget drops src's per-source gauges (counters stay: they are this
// process's own work).
func (m *metrics) forget(src relaycore.Partition) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.seen, src)
	for _, g := range []*prometheus.GaugeVec{m.blocked, m.quarantined, m.paused, m.held} {
		g.DeleteLabelValues(string(src))
	}
}

func (m *metrics) sweep(found int, err error) {
	m.sweeps.Inc()
	m.sweepOverdue.Add(float64(found))
	if err != nil {
		m.sweepErrors.Inc()
	}
}

// ageCollector exports each source's oldest undelivered commit time
// (metrics.seen, set by its alarms and refreshes) aged when scraped, so a
// source whose alarms stopped shows a growing age rather than the last
// one measured.
type ageCollector struct {
	m    *metrics
	desc *prometheus.Desc
}

func (a *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

func (a *ageCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now().UnixMilli()
	a.m.mu.Lock()
	defer a.m.mu.Unlock()
	for src, e := range a.m.seen {
		if !e.known {
			continue
		}
		age := 0.0
		if e.lowerMS > 0 {
			age = float64(max(0, now-e.lowerMS)) / 1000
		}
		ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, age, string(src))
	}
}

// clockCollector exports the alarm clock's checks (infra/alarmclock): a
// wake-up the clock was not kicked for (the sweep's, or a retry after a
// claim) is checked before it fires, and with replicas on one database
// the checks that leave a source to another replica are the work sharing
// costs, one read each. relay_replica_info names the replica, so a
// dashboard can tell the replicas' series apart beyond their instance.
type clockCollector struct {
	stats   func() alarmclock.Stats // nil: all zero
	replica string
}

var (
	checksDesc = prometheus.NewDesc("relay_alarm_checks_total",
		"Wake-ups checked before firing (found by the sweep, or retried after a claim), by outcome: fired, done (no alarm due: fired or re-armed elsewhere), claimed (a live claim held the source), failed (the read failed).",
		[]string{"outcome"}, nil)
	lingeredDesc = prometheus.NewDesc("relay_alarms_lingered_total",
		"Fires of a source held back by alarms.linger after a fire that delivered while rows kept coming.", nil, nil)
	replicaDesc = prometheus.NewDesc("relay_replica_info", "1, labelled with this process's alarms.replica name.", []string{"replica"}, nil)
)

func (c *clockCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- checksDesc
	ch <- lingeredDesc
	ch <- replicaDesc
}

func (c *clockCollector) Collect(ch chan<- prometheus.Metric) {
	var st alarmclock.Stats
	if c.stats != nil {
		st = c.stats()
	}
	for _, o := range []struct {
		outcome string
		n       int64
	}{
		{"fired", st.Checks - st.SkippedDone - st.SkippedClaimed - st.CheckErrors},
		{"done", st.SkippedDone}, {"claimed", st.SkippedClaimed}, {"failed", st.CheckErrors},
	} {
		ch <- prometheus.MustNewConstMetric(checksDesc, prometheus.CounterValue, float64(o.n), o.outcome)
	}
	ch <- prometheus.MustNewConstMetric(lingeredDesc, prometheus.CounterValue, float64(st.Lingered))
	ch <- prometheus.MustNewConstMetric(replicaDesc, prometheus.GaugeValue, 1, c.replica)
}
