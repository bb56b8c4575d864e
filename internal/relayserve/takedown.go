package relayserve

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Takedowns configures the takedown owner (docs/takedown.md).
type Takedowns struct {
	// CA (takedowns.ca, default: tls.client_ca) is the PEM file of the CA
	// certificates node receipts must chain to. Without either, receipts
	// are refused (500 not_configured) and the rest works.
	CA string `yaml:"ca"`
	// Overdue (takedowns.overdue, default 24h) is how long after its
	// request a holder's order is reported overdue.
	Overdue time.Duration `yaml:"overdue"`
	// CloseAfter (takedowns.close_after, default 720h) is how long a
	// complete takedown stays watched after its last receipt or waiver
	// (takedowns.Owner.CloseAfter).
	CloseAfter time.Duration `yaml:"close_after"`
}

// takedownRoots loads the CA receipts are verified against (nil: none
// configured).
func takedownRoots(cfg Config) (*x509.CertPool, error) {
	path := cfg.Takedowns.CA
	key := "takedowns.ca"
	if path == "" {
		path, key = cfg.TLS.ClientCA, "tls.client_ca"
	}
	if path == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", key, path)
	}
	return p, nil
}

// takedownMetrics are the owner's Prometheus series (the Lambda sweep
// writes the same as EMF metrics).
type takedownMetrics struct {
	open, pending, overdue prometheus.Gauge
	runs                   *prometheus.CounterVec
	orders, late           prometheus.Counter
}

func newTakedownMetrics(reg *prometheus.Registry) *takedownMetrics {
	m := &takedownMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "relay_takedowns_open",
			Help: "Takedowns the owner watches (as of its last pass)."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "relay_takedown_holders_pending",
			Help: "Holders of open takedowns without a verified receipt or a waiver (as of the owner's last pass)."}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "relay_takedown_holders_overdue",
			Help: "Pending holders whose order is past takedowns.overdue (as of the owner's last pass); alert on > 0."}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "relay_takedown_owner_runs_total",
			Help: "Owner passes, by result (ok, error)."}, []string{"result"}),
		orders: prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_takedown_orders_total",
			Help: "Orders the owner wrote into holders' order partitions."}),
		late: prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_takedown_late_requests_total",
			Help: "Requests the owner made for late holders."}),
	}
	reg.MustRegister(m.open, m.pending, m.overdue, m.runs, m.orders, m.late)
	return m
}

// runOwner runs owner passes until ctx ends: one at start, one every
// interval, and one after each kick (an alarm of a takedown source ran:
// something it delivered may be the owner's next step). Kicks coalesce.
func runOwner(ctx context.Context, o *takedowns.Owner, interval time.Duration, kick <-chan struct{}, m *takedownMetrics, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := o.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.runs.WithLabelValues("error").Inc()
			log.Error("takedown owner: pass failed (the next pass starts over)", "err", err)
		} else {
			m.runs.WithLabelValues("ok").Inc()
		}
		m.open.Set(float64(r.Open))
		m.pending.Set(float64(r.Pending))
		m.overdue.Set(float64(r.Overdue))
		m.orders.Add(float64(r.Ordered))
		m.late.Add(float64(r.LateRequests))
		if r.Ordered+r.LateRequests > 0 || r.Overdue > 0 {
			log.Info("takedown owner: pass", "open", r.Open, "complete", r.Complete, "waiting", r.Waiting,
				"ordered", r.Ordered, "late_requests", r.LateRequests, "pending", r.Pending, "overdue", r.Overdue)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}
