package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// Pipelined delivery on version 2 connections (docs/wire.md). A worker
// that got a version 2 connection for a claimed record claims more due
// records of the same peer, up to the peer's window, in one ledger
// transaction (ClaimBatch), delivers them all on that connection with up
// to the window in flight (wire.Conn.DeliverWindow), and records the
// ACKs in one transaction (AckBatch) and the relayed markers in another.
// Per record the rules do not change: it is Inflight before its OFFER,
// and Acked only after the peer's ACK naming it.

// claimScanFactor: claimMore looks at this many due records per wanted
// one, since the due list interleaves peers.
const claimScanFactor = 4

// claimMore claims up to n more due records of peer, in ledger order.
func (e *Executor) claimMore(peer string, n int) []ledger.Record {
	if n <= 0 {
		return nil
	}
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	now := e.cfg.Now()
	due, err := e.led.Pending(now, claimScanFactor*n+claimBatch)
	if err != nil {
		e.log.Error("relay claim failed", "err", err)
		return nil
	}
	var pairs []ledger.Pair
	for _, r := range due {
		if r.PeerID == peer && len(pairs) < n {
			pairs = append(pairs, ledger.Pair{SegmentID: r.SegmentID, PeerID: r.PeerID})
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	recs, err := e.led.ClaimBatch(pairs, now)
	if err != nil {
		e.log.Error("relay claim failed", "err", err)
		return nil
	}
	return recs
}

// outcome is one record's delivery result.
type outcome struct {
	size int64
	err  error
}

// deliverWindow delivers recs on a version 2 connection. The connection
// goes back to the pool unless it failed; a pooled connection that turns
// out dead before any reply is replaced by a fresh dial once.
func (e *Executor) deliverWindow(ctx context.Context, conn *wire.Conn, reused bool, recs []ledger.Record) []outcome {
	outs := make([]outcome, len(recs))
	var items []wire.Item
	var at []int // items[k] is recs[at[k]]
	for i, rec := range recs {
		entry, err := e.store.Stat(rec.SegmentID)
		if err != nil {
			if errors.Is(err, segstore.ErrNotFound) {
				err = errSegmentMissing
			}
			outs[i].err = fmt.Errorf("deliver %s: %w", rec.SegmentID, err)
			continue
		}
		id := entry.ID
		items = append(items, wire.Item{
			Offer: wire.Offer{SegmentID: id, Size: entry.Size, SHA256: entry.SHA256},
			Open: func() (io.ReadCloser, error) {
				f, _, err := e.store.Open(id)
				return f, err
			},
		})
		at = append(at, i)
		outs[i].size = entry.Size
	}
	if len(items) == 0 {
		e.pool.put(recs[0].PeerID, conn)
		return outs
	}
	peer := recs[0].PeerID
	res := conn.DeliverWindow(ctx, items, e.cfg.AckTimeout)
	if reused && stale(res) {
		conn.Close()
		var err error
		if conn, err = e.dialPeer(ctx, peer, e.cfg.Peers[peer]); err != nil {
			for _, i := range at {
				outs[i].err = err
			}
			return outs
		}
		if conn.Version() < wire.Version2 {
			conn.Close()
			for _, i := range at {
				outs[i].err = fmt.Errorf("deliver to %s: peer now speaks version %d: retry", peer, conn.Version())
			}
			return outs
		}
		res = conn.DeliverWindow(ctx, items, e.cfg.AckTimeout)
	}
	broken := false
	for k, r := range res {
		outs[at[k]].err = r.Err
		if r.Err != nil && !r.Replied {
			broken = true
		}
	}
	if broken {
		conn.Close()
	} else {
		e.pool.put(peer, conn)
	}
	return outs
}

// stale reports whether a pooled connection was dead before the peer saw
// anything: no reply at all, and every failure looks like a closed
// connection.
func stale(res []wire.Result) bool {
	for _, r := range res {
		if r.Replied || r.Err == nil || !staleConn(r.Err) {
			return false
		}
	}
	return true
}

// finishBatch records a window's outcomes: the ACKs in one transaction,
// then the success conditions of their segments, then each failure.
func (e *Executor) finishBatch(recs []ledger.Record, outs []outcome, elapsed time.Duration) {
	var acked []ledger.Pair
	for i, rec := range recs {
		if outs[i].err == nil {
			acked = append(acked, ledger.Pair{SegmentID: rec.SegmentID, PeerID: rec.PeerID})
		}
	}
	if len(acked) > 0 {
		if _, err := e.led.AckBatch(acked, e.cfg.Now()); err != nil {
			// Record them one by one: the single transitions say which
			// one the ledger refuses.
			e.log.Warn("relay ack batch not recorded; recording one by one", "err", err)
			for i, rec := range recs {
				if outs[i].err == nil {
					e.finish(rec, outs[i].size, nil, elapsed)
				}
			}
			acked = nil
		}
	}
	ids := make([]string, 0, len(acked))
	for i, rec := range recs {
		if outs[i].err != nil || acked == nil {
			continue
		}
		e.observe(rec.PeerID, "acked", outs[i].size, elapsed)
		e.log.Info("relay acked", "segment", rec.SegmentID, "peer", rec.PeerID, "attempt", rec.Attempts,
			"bytes", outs[i].size, "duration", elapsed, "window", len(recs))
		ids = append(ids, rec.SegmentID)
	}
	e.checkSuccessConditions(ids)
	for i, rec := range recs {
		if outs[i].err != nil {
			e.failed(rec, outs[i].err, elapsed)
		}
	}
}
