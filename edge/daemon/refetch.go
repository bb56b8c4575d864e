package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
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
	d.kickRefetch()
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

// Asking for lost segments (wire version 3, docs/wire.md "WANT").
//
// A segment the store lost after acknowledging it (segstore's wanted
// records) is owed to this node by nobody: the peers that hold it have
// acked records for it. So this node asks them, on a connection of its
// own: WANT names the lost segments with the size and digest they had,
// and a peer that holds exactly that segment resends it (ledger.Resend)
// and says so in its HOLDS. Whom to ask: the peer the segment came from,
// and every peer this node has a record for it with (holdersOf). Rounds
// repeat, with relay.backoff between them, until every lost segment is
// stored again; a new loss starts a round at once.

// refetchLoop runs the rounds until ctx ends.
func (d *Daemon) refetchLoop(ctx context.Context) {
	round := 0
	for ctx.Err() == nil {
		wanted, err := d.store.Wanted()
		if err != nil {
			d.log.Error("listing lost segments failed", "err", err)
		}
		wait := time.Duration(-1) // until the next loss
		if len(wanted) > 0 {
			round++
			d.askPeers(ctx, wanted, round == 1)
			wait = policy(d.cfg).Backoff(round)
		} else {
			round = 0
		}
		var timer <-chan time.Time
		var t *time.Timer
		if wait >= 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-d.refetchKick:
			round = 0
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// kickRefetch starts a round at once (a segment was just lost).
func (d *Daemon) kickRefetch() {
	select {
	case d.refetchKick <- struct{}{}:
	default:
	}
}

// askPeers is one round: each lost segment is asked of its candidates in
// peer id order until one grants it.
func (d *Daemon) askPeers(ctx context.Context, wanted []segstore.Wanted, first bool) {
	byPeer := map[string][]wire.Offer{}
	for _, w := range wanted {
		peers := d.holdersOf(w)
		if len(peers) == 0 && first {
			d.log.Warn("lost segment: no peer to ask for it (no known peer sent it here or acknowledged it; inbound-only peers in accept_from are never dialled); an operator can resend it from a node that holds it",
				"segment", w.ID, "source", w.Source)
		}
		for _, p := range peers {
			byPeer[p] = append(byPeer[p], wire.Offer{SegmentID: w.ID, Size: w.Size, SHA256: w.SHA256})
		}
	}
	granted := map[string]bool{}
	for _, peer := range slices.Sorted(maps.Keys(byPeer)) {
		var ask []wire.Offer
		for _, o := range byPeer[peer] {
			if !granted[o.SegmentID] {
				ask = append(ask, o)
			}
		}
		if len(ask) == 0 || ctx.Err() != nil {
			continue
		}
		got, err := d.want(ctx, peer, ask)
		if err != nil {
			d.log.Warn("asking a peer for lost segments failed", "peer", peer, "segments", len(ask), "err", err)
			continue
		}
		for _, o := range got {
			granted[o.SegmentID] = true
		}
		d.log.Info("asked a peer for lost segments", "peer", peer, "asked", len(ask), "granted", len(got))
	}
}

// holdersOf returns the known peers that may hold w: its source, and
// every peer this node has a record for it with, in any state. Not only
// acked ones: a record that was acked and then made due again (a resend
// the peer asked for, an operator's) and whose attempt then read the
// damaged copy is failed or deadlettered now, although the peer holds the
// segment; asking only acked peers left such a segment lost for good
// (TestLostSegmentAskedOfPeersStillOwed). A peer that does not hold it
// grants nothing, and the rounds back off.
func (d *Daemon) holdersOf(w segstore.Wanted) []string {
	set := map[string]bool{}
	if p, ok := d.cfg.Peer(w.Source); ok && p.Address != "" {
		set[p.ID] = true
	}
	recs, err := d.led.ListBySegment(w.ID)
	if err != nil {
		d.log.Error("reading the ledger for a lost segment failed", "segment", w.ID, "err", err)
	}
	for _, r := range recs {
		if p, ok := d.cfg.Peer(r.PeerID); ok && p.Address != "" {
			set[p.ID] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// want dials peer and sends the WANTs for list, at most
// wire.MaxQuerySegments at a time; a peer below version 3 cannot be asked.
func (d *Daemon) want(ctx context.Context, peer string, list []wire.Offer) ([]wire.Offer, error) {
	p, _ := d.cfg.Peer(peer)
	dctx, cancel := context.WithTimeout(ctx, d.cfg.Relay.DialTimeout)
	defer cancel()
	c, err := d.tr.Dial(dctx, p.Address, peer)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if c.Version() < wire.Version3 {
		return nil, fmt.Errorf("peer speaks wire version %d, WANT needs 3: resend from it with edgectl relay resend", c.Version())
	}
	var granted []wire.Offer
	for chunk := range slices.Chunk(list, wire.MaxQuerySegments) {
		actx, cancel := context.WithTimeout(ctx, d.cfg.Relay.AckTimeout)
		got, _, err := c.Want(actx, chunk)
		cancel()
		if err != nil {
			return granted, err
		}
		granted = append(granted, got...)
	}
	return granted, nil
}

// grant answers a peer's WANT: each segment this node holds with exactly
// the wanted size and digest is sent to the peer again (ledger.Resend,
// whatever its record said) and named in the HOLDS. Only a peer this node
// can dial (known_peers) can be sent anything.
func (d *Daemon) grant(log *slog.Logger, peer string, want []wire.Offer) []wire.Offer {
	if p, ok := d.cfg.Peer(peer); !ok || p.Address == "" {
		log.Warn("peer asked for lost segments, but it is not in known_peers: nothing can be sent to it", "segments", len(want))
		return nil
	}
	granted := []wire.Offer{}
	var pairs []ledger.Pair
	for _, o := range want {
		e, err := d.store.Stat(o.SegmentID)
		if err != nil || e.Size != o.Size || e.SHA256 != o.SHA256 {
			continue
		}
		granted = append(granted, o)
		pairs = append(pairs, ledger.Pair{SegmentID: o.SegmentID, PeerID: peer})
	}
	// One transaction for the whole WANT: a peer must not cost this node a
	// commit per segment it names.
	if _, _, err := d.led.ResendAll(pairs, d.opt.Now()); err != nil {
		log.Error("resend for a peer that lost segments failed", "segments", len(pairs), "err", err)
		granted = []wire.Offer{}
	}
	if len(granted) > 0 {
		d.ex.ResetCircuits(peer)
		d.ex.Kick()
	}
	log.Info("peer asked for lost segments", "wanted", len(want), "granted", len(granted))
	return granted
}
