package daemon

import (
	"time"

	"github.com/relay-dev/relay/edge/bandwidth"
	"github.com/relay-dev/relay/edge/config"
)

// makeRoomFunc is the store's MakeRoom under storage.on_full:
// evict_relayed_oldest, and nil (refuse) under reject. d.ex is set after
// the store is opened; the store calls this only for reservations and
// writes, which start after New.
func (d *Daemon) makeRoomFunc() func(bytes, segments int64) {
	if d.cfg.Storage.OnFull != config.OnFullEvictRelayedOldest {
		return nil
	}
	return d.makeRoom
}

// makeRoom evicts relayed segments that are owed to no one, oldest first
// (relay.Executor.MakeRoom), and says what it did: an operator who sees
// segments vanish must find why in the log.
func (d *Daemon) makeRoom(bytes, segments int64) {
	ev := d.ex.MakeRoom(bytes, segments)
	if len(ev) == 0 {
		d.log.Warn("storage full: nothing can be evicted (every stored segment is unrelayed or still owed)",
			"need_bytes", bytes, "need_segments", segments)
		return
	}
	ids := make([]string, len(ev))
	var freed int64
	for i, e := range ev {
		ids[i] = e.ID
		freed += e.Size
	}
	d.met.fullEvictions.Add(float64(len(ev)))
	d.log.Info("storage full: evicted relayed segments", "segments", ids, "bytes", freed,
		"need_bytes", bytes, "need_segments", segments)
}

// bandwidth builds the send limits of relay.bandwidth (edge/bandwidth),
// reporting time spent waiting for tokens per peer. Without limits Wrap
// returns each connection unchanged.
func (d *Daemon) bandwidth() *bandwidth.Limits {
	b := d.cfg.Relay.Bandwidth
	own := map[string]int64{}
	for _, p := range d.cfg.KnownPeers {
		if p.Bandwidth > 0 {
			own[p.ID] = int64(p.Bandwidth)
		}
	}
	l := bandwidth.New(int64(b.Total), int64(b.PerPeer), own, nil)
	l.OnWait = func(peer string, wait time.Duration) {
		d.met.throttled.WithLabelValues(peer).Add(wait.Seconds())
	}
	return l
}
