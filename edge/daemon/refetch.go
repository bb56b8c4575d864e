package daemon

import (
	"path/filepath"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// A stored copy found damaged while edged runs (segstore's verify on
// read: a sender reads every byte it sends) is quarantined by the store
// as the start-up check does it; the daemon says so and counts it.

// onQuarantine reports a copy the store quarantined on read. It runs on
// the goroutine that read it (a relay attempt), which then fails: the
// record's next attempt finds the segment missing and deadletters it.
func (d *Daemon) onQuarantine(q segstore.Quarantined) {
	d.met.repairs.WithLabelValues("quarantined").Inc()
	d.log.Error("damaged segment quarantined on read; it is not served", "segment", q.ID,
		"file", filepath.Join(d.cfg.Storage.Dir, segstore.QuarantineDir, q.File), "reason", q.Reason)
}

// onRefetched reports a lost segment stored again, and gives its
// deliveries that were deadlettered because it was missing a fresh
// budget: the segment is back, so they can succeed.
func (d *Daemon) onRefetched(e segstore.Entry) {
	recs, err := d.led.RetryDeadletter(e.ID, "", d.opt.Now())
	if err != nil {
		d.log.Error("lost segment stored again; retrying its deadlettered deliveries failed", "segment", e.ID, "err", err)
		return
	}
	d.log.Info("lost segment stored again", "segment", e.ID, "source", e.Source, "retried", pairs(recs))
	if len(recs) > 0 {
		d.ex.Kick()
	}
}

// resend makes the ledger send a stored segment to peer again, and the
// workers go at once: the peer's dial circuit is closed (it just asked,
// or an operator says it is back) so the record is not deferred.
func (d *Daemon) resend(seg, peer string) (ledger.Record, bool, error) {
	r, resent, err := d.led.Resend(seg, peer, d.opt.Now())
	if err != nil {
		return ledger.Record{}, false, err
	}
	if resent {
		d.ex.ResetCircuits(peer)
		d.ex.Kick()
	}
	return r, resent, nil
}
