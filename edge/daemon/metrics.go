package daemon

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/relay"
)

// metrics lives on its own registry (no global state), served at
// /metrics. Gauges of stored state are read at scrape time, so they can
// never drift from the store and the ledger.
type metrics struct {
	reg            *prometheus.Registry
	inbound        *prometheus.CounterVec
	nacks          *prometheus.CounterVec
	protocolErrors *prometheus.CounterVec
	rejected       prometheus.Counter
	shed           *prometheus.CounterVec
	reloadErrors   prometheus.Counter
	reloads        prometheus.Counter
	certNotAfter   prometheus.Gauge
	attempts       *prometheus.CounterVec
	sentBytes      *prometheus.CounterVec
	attemptSecs    prometheus.Histogram
	relayed        prometheus.Counter
	evicted        prometheus.Counter
	deferred       *prometheus.CounterVec
	dials          *prometheus.CounterVec
	removed        prometheus.Counter
	repairs        *prometheus.CounterVec
	fullEvictions  prometheus.Counter
	throttled      *prometheus.CounterVec
	takedowns      *prometheus.CounterVec
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		inbound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_inbound_segments_total", Help: "Offers received, by result (stored, duplicate, refused, aborted: the sender went away or stalled mid-segment).",
		}, []string{"result"}),
		protocolErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_inbound_protocol_errors_total", Help: "Protocol violations by authenticated peers, by reason (unknown_type, too_large, unexpected_frame, size_mismatch, bad_message, version); each closes the connection.",
		}, []string{"reason"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_nacks_sent_total", Help: "NACKs sent, by code.",
		}, []string{"code"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_inbound_connections_rejected_total", Help: "Inbound connections refused: during TLS or HELLO (bad certificate, unknown node), or over the per-peer connection limit.",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_inbound_handshakes_shed_total", Help: "Inbound connections closed before their TLS handshake finished, to keep unauthenticated ones from holding the handshake slots, by reason (address_limit: too many unfinished from one address; evicted: the oldest, given up for a newer one when all were taken). Counted in edged_inbound_connections_rejected_total too.",
		}, []string{"reason"}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_certificate_reload_errors_total", Help: "Certificate reloads that failed (the previous certificate stays in use).",
		}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_certificate_reloads_total", Help: "Certificates put in use since the start (changed files picked up at a handshake, or on SIGHUP), not counting the one loaded at start.",
		}),
		certNotAfter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edged_certificate_not_after_timestamp_seconds", Help: "NotAfter of the certificate in use (this node's, for its TLS handshakes), in Unix seconds.",
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relay_attempts_total", Help: "Outbound delivery attempts, by peer and outcome (acked, failed, postponed: refused for want of room or because the peer is taking in another copy, retry budget kept, deadletter, cancelled: taken down at the peer or here while sending).",
		}, []string{"peer", "outcome"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relay_acked_bytes_total", Help: "Segment bytes acknowledged by peers.",
		}, []string{"peer"}),
		attemptSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edged_relay_attempt_seconds", Help: "Duration of outbound attempts.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		relayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_relay_success_total", Help: "Segments whose success condition was met.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_evicted_segments_total", Help: "Segments evicted on relay.",
		}),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relay_deferred_total", Help: "Due records deferred without an attempt because the peer's dial circuit was open or it refused for want of room.",
		}, []string{"peer"}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_peer_dials_total", Help: "Outbound dials (TCP connect, TLS handshake, HELLO), by peer and result (ok, failed).",
		}, []string{"peer", "result"}),
		removed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_ledger_records_removed_total", Help: "Ledger records removed by relay.ledger_retention (all acked, segment no longer stored).",
		}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_storage_repairs_total", Help: "What the start-up checks repaired, by action (db_moved_aside, rebuilt, rebuilt_unverified, quarantined, dropped_entry, removed_orphan, removed_temp); quarantined also counts copies found damaged on read since.",
		}, []string{"action"}),
		fullEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edged_storage_full_evictions_total", Help: "Relayed segments evicted to make room under storage.on_full: evict_relayed_oldest.",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_relay_throttled_seconds_total", Help: "Time outbound writes waited for relay.bandwidth tokens, by peer.",
		}, []string{"peer"}),
		takedowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edged_takedowns_total", Help: "Takedown evictions asked of this node, by result (evicted: the segment was removed and a receipt signed; receipt: it had been taken down already and the receipt for the request was returned or signed; refused: not held, or no receipt could be signed: nothing changed).",
		}, []string{"result"}),
	}
	m.reg.MustRegister(m.inbound, m.nacks, m.protocolErrors, m.rejected, m.shed, m.reloadErrors, m.reloads, m.certNotAfter, m.attempts, m.sentBytes, m.attemptSecs,
		m.relayed, m.evicted, m.deferred, m.dials, m.removed, m.repairs, m.fullEvictions, m.throttled, m.takedowns,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		storeCollector{d})
	return m
}

func (m *metrics) observer() relay.Observer {
	return relay.Observer{
		Attempt: func(peer, outcome string, bytes int64, d time.Duration) {
			m.attempts.WithLabelValues(peer, outcome).Inc()
			m.attemptSecs.Observe(d.Seconds())
			if bytes > 0 {
				m.sentBytes.WithLabelValues(peer).Add(float64(bytes))
			}
		},
		Relayed:  func(string) { m.relayed.Inc() },
		Evicted:  func(string, int64) { m.evicted.Inc() },
		Deferred: func(peer string, n int) { m.deferred.WithLabelValues(peer).Add(float64(n)) },
		Removed:  func(n int) { m.removed.Add(float64(n)) },
		Dialed: func(peer string, err error) {
			result := "ok"
			if err != nil {
				result = "failed"
			}
			m.dials.WithLabelValues(peer, result).Inc()
		},
	}
}

// storeCollector reports storage use and ledger record counts per state.
type storeCollector struct{ d *Daemon }

var (
	descStoredBytes = prometheus.NewDesc("edged_storage_bytes", "Bytes of stored segments.", nil, nil)
	descStoredSegs  = prometheus.NewDesc("edged_storage_segments", "Stored segments.", nil, nil)
	descReserved    = prometheus.NewDesc("edged_storage_reserved_bytes", "Bytes reserved by receives in progress.", nil, nil)
	descQuotaBytes  = prometheus.NewDesc("edged_quota_bytes", "storage.quota_bytes.", nil, nil)
	descQuotaSegs   = prometheus.NewDesc("edged_quota_segments", "storage.quota_segments.", nil, nil)
	descPackFiles   = prometheus.NewDesc("edged_storage_pack_files", "Pack files (storage.pack_max_bytes).", nil, nil)
	descPackSegs    = prometheus.NewDesc("edged_storage_packed_segments", "Segments stored in pack files.", nil, nil)
	descPackDisk    = prometheus.NewDesc("edged_storage_pack_disk_bytes",
		"Disk space the pack files take (allocated blocks); compare with edged_storage_pack_record_bytes.", nil, nil)
	descPackRecords = prometheus.NewDesc("edged_storage_pack_record_bytes", "Bytes of the packed segments' records, headers and padding included.", nil, nil)
	descRecords     = prometheus.NewDesc("edged_ledger_records", "Ledger records by state.", []string{"state"}, nil)
	descLost        = prometheus.NewDesc("edged_storage_lost_segments",
		"Segments this node acknowledged and then lost (quarantined, or gone at start), not stored again yet: asked back from its peers.", nil, nil)
	descHandshakes = prometheus.NewDesc("edged_inbound_handshakes",
		"Inbound connections whose TLS handshake and HELLO have not finished (at most 64; see edged_inbound_handshakes_shed_total).", nil, nil)
	descCircuit = prometheus.NewDesc("edged_peer_circuit_state",
		"Dial circuit per peer: 1 for its current state (closed, open, half_open), 0 for the others.", []string{"peer", "state"}, nil)
	descRoom = prometheus.NewDesc("edged_peer_room_state",
		"Room circuit per peer: open while the peer refuses segments for want of room (NACK quota); 1 for its current state (closed, open, half_open), 0 for the others.", []string{"peer", "state"}, nil)
)

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoredBytes, descStoredSegs, descReserved, descQuotaBytes, descQuotaSegs,
		descPackFiles, descPackSegs, descPackDisk, descPackRecords, descRecords, descHandshakes, descCircuit, descRoom, descLost} {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.d.store.Usage()
	ch <- prometheus.MustNewConstMetric(descStoredBytes, prometheus.GaugeValue, float64(u.Bytes))
	ch <- prometheus.MustNewConstMetric(descStoredSegs, prometheus.GaugeValue, float64(u.Segments))
	ch <- prometheus.MustNewConstMetric(descReserved, prometheus.GaugeValue, float64(u.ReservedBytes))
	ch <- prometheus.MustNewConstMetric(descQuotaBytes, prometheus.GaugeValue, float64(u.QuotaBytes))
	ch <- prometheus.MustNewConstMetric(descQuotaSegs, prometheus.GaugeValue, float64(u.QuotaSegments))
	ps := c.d.store.PackStats()
	ch <- prometheus.MustNewConstMetric(descPackFiles, prometheus.GaugeValue, float64(ps.Files))
	ch <- prometheus.MustNewConstMetric(descPackSegs, prometheus.GaugeValue, float64(ps.Records))
	ch <- prometheus.MustNewConstMetric(descPackDisk, prometheus.GaugeValue, float64(ps.DiskBytes))
	ch <- prometheus.MustNewConstMetric(descPackRecords, prometheus.GaugeValue, float64(ps.RecordBytes))
	ch <- prometheus.MustNewConstMetric(descLost, prometheus.GaugeValue, float64(c.d.store.WantedCount()))
	if ln := c.d.relayLn; ln != nil { // set by Listen, before the RPC serves
		_, handshaking := ln.Pending()
		ch <- prometheus.MustNewConstMetric(descHandshakes, prometheus.GaugeValue, float64(handshaking))
	}
	for _, circ := range c.d.ex.Circuits() {
		for _, s := range relay.CircuitStates() {
			v := 0.0
			if circ.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descCircuit, prometheus.GaugeValue, v, circ.Peer, string(s))
		}
		for _, s := range relay.CircuitStates() {
			v := 0.0
			if circ.Room == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descRoom, prometheus.GaugeValue, v, circ.Peer, string(s))
		}
	}
	counts, err := c.d.led.Counts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descRecords, err)
		return
	}
	for _, s := range ledger.States() {
		ch <- prometheus.MustNewConstMetric(descRecords, prometheus.GaugeValue, float64(counts[s]), s.String())
	}
}
