package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// Pipelined delivery on version 2 connections (docs/wire.md). A worker
// that got a version 2 connection for a claimed record keeps the
// connection's window full: as slots free up it claims more due records
// of the same peer, a quarter window per ledger transaction (ClaimBatch),
// and offers them (wire.Conn.DeliverStream); ACKs are recorded as they
// arrive, all those that arrived meanwhile in one transaction (AckBatch),
// followed by their relayed markers in another. It stops when nothing of
// the peer is due, the executor stops, or the connection fails. Per
// record the rules do not change: it is Inflight before its OFFER, and
// Acked only after the peer's ACK naming it.

// claimScanFactor: claimMore looks at this many due records per wanted
// one, since the due list interleaves peers.
const claimScanFactor = 4

// claimMore claims up to n more due records of peer, in ledger order.
func (e *Executor) claimMore(peer string, n int) []ledger.Record {
	if n <= 0 || e.resyncBusy(peer) {
		return nil // another stream is summarising: see claimNext
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

// stream is one pipelined delivery session on a version 2 connection:
// records claimed as window slots free up, ACKs recorded in batches as
// they arrive, failures recorded at the end.
type stream struct {
	e     *Executor
	soft  context.Context // Run's context: once done, no more claims
	peer  string
	probe bool
	chunk int

	queue []ledger.Record // claimed, not yet offered (writer goroutine only)

	mu       sync.Mutex
	inflight map[string]flight // offered, no result yet
	failed   []failure         // results with an error, not yet recorded
	missing  []failure         // segments gone before their offer
	replied  bool              // the peer answered anything
	acked    bool              // some record was acked
	acks     chan flight       // to the recorder
}

type flight struct {
	rec   ledger.Record
	size  int64
	start time.Time
}

type failure struct {
	f   flight
	err error
}

// executeStream delivers first, and whatever else is due for its peer,
// on a version 2 connection until nothing more is due (or the executor
// stops, or the connection fails).
func (e *Executor) executeStream(soft, ctx context.Context, conn *wire.Conn, reused bool, first ledger.Record, probe, resync bool) {
	st := &stream{e: e, soft: soft, peer: first.PeerID, probe: probe,
		chunk: max(1, conn.PeerWindow()/4), queue: []ledger.Record{first}, inflight: map[string]flight{}}
	st.acks = make(chan flight, conn.PeerWindow())
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		st.record()
	}()
	var err error
	if resync {
		err = st.resync(ctx, conn)
		e.endResync(st.peer, err == nil)
	}
	if err == nil {
		err = conn.DeliverStream(ctx, st.next, st.done, e.cfg.AckTimeout)
	}
	st.mu.Lock()
	retry := err != nil && reused && !st.replied && staleConn(err)
	st.mu.Unlock()
	if retry {
		// The pooled connection was dead before the peer saw anything
		// (typically closed by its idle timeout): one fresh try with the
		// same records.
		conn.Close()
		st.mu.Lock()
		for _, f := range slices.Backward(st.failed) {
			st.queue = append([]ledger.Record{f.f.rec}, st.queue...)
		}
		st.failed = nil
		st.mu.Unlock()
		conn, err = e.dialPeer(ctx, st.peer, e.cfg.Peers[st.peer])
		switch {
		case err != nil:
			conn = nil
		case conn.Version() < wire.Version2:
			err = fmt.Errorf("deliver to %s: peer now speaks version %d: retry", st.peer, conn.Version())
			conn.Close()
			conn = nil
		default:
			err = conn.DeliverStream(ctx, st.next, st.done, e.cfg.AckTimeout)
		}
	}
	// Records claimed but not offered when the connection failed are
	// failed attempts too: they are Inflight in the ledger.
	for _, rec := range st.queue {
		st.failed = append(st.failed, failure{flight{rec: rec, start: time.Now()}, fmt.Errorf("not offered: %w", err)})
	}
	st.queue = nil
	if err != nil {
		// The peer may go offline after this: summarise again next time.
		e.needResync(st.peer)
	}
	close(st.acks)
	<-recorded
	if conn != nil {
		if err != nil {
			conn.Close()
		} else {
			e.pool.put(st.peer, conn)
		}
	}
	for _, f := range append(st.missing, st.failed...) {
		e.failed(f.f.rec, f.err, time.Since(f.f.start))
	}
}

// resyncMin: a backlog of fewer due records is offered without a QUERY
// first; offers that the peer declines cost little at that size.
const resyncMin = 64

// resync is the summary exchange at the start of a stream (after a
// (re)connect, or whenever work for the peer resumes): while 64 or more of
// the peer's records are due, it asks the peer which of up to
// wire.MaxQuerySegments of their segments it already holds (one QUERY,
// one HOLDS). Those the peer names with exactly our size and digest are
// claimed and Acked on that claim, two transactions for the lot, without
// an OFFER each; a name with another digest counts for nothing. The
// others stay due: the stream (this worker's and others') claims them a
// quarter window at a time. Querying reads the ledger only, so records
// are not held Inflight while the peer is asked. It goes on while a round
// finds most segments held and the backlog is not exhausted, and leaves
// the peer marked for another summary at the next stream start unless a
// round found most segments new to the peer.
func (st *stream) resync(ctx context.Context, conn *wire.Conn) error {
	e := st.e
	if st.probe {
		return nil
	}
	queried := map[string]bool{}
	// The record this stream was started with is claimed already: it is
	// asked about in the first QUERY too, so a held one is not offered.
	var first []wire.Offer
	if len(st.queue) == 1 {
		if entry, err := e.store.Stat(st.queue[0].SegmentID); err == nil {
			first = []wire.Offer{{SegmentID: entry.ID, Size: entry.Size, SHA256: entry.SHA256}}
			queried[entry.ID] = true
		}
	}
	for st.soft.Err() == nil {
		due, err := e.led.Pending(e.cfg.Now(), len(queried)+claimScanFactor*wire.MaxQuerySegments)
		if err != nil {
			return nil // the stream claims as usual
		}
		offers := first
		first = nil
		for _, r := range due {
			if r.PeerID != st.peer || queried[r.SegmentID] || len(offers) == wire.MaxQuerySegments {
				continue
			}
			entry, err := e.store.Stat(r.SegmentID)
			if err != nil {
				continue // the stream deals with it
			}
			offers = append(offers, wire.Offer{SegmentID: entry.ID, Size: entry.Size, SHA256: entry.SHA256})
		}
		if len(offers) < resyncMin {
			// Too little is due to be worth a QUERY now, but more may
			// come due (a backlog deferred by the dial circuit comes due
			// in steps): ask again at a later stream start.
			e.needResync(st.peer)
			return nil
		}
		for _, o := range offers {
			queried[o.SegmentID] = true
		}
		held, mismatched, err := conn.Query(ctx, offers)
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.replied = true
		st.mu.Unlock()
		var batch []flight
		var pairs []ledger.Pair
		for _, o := range held {
			if len(st.queue) == 1 && st.queue[0].SegmentID == o.SegmentID {
				batch = append(batch, flight{rec: st.queue[0], size: o.Size, start: time.Now()})
				st.queue = nil
				continue
			}
			pairs = append(pairs, ledger.Pair{SegmentID: o.SegmentID, PeerID: st.peer})
		}
		if len(pairs) > 0 {
			e.claimMu.Lock()
			recs, err := e.led.ClaimBatch(pairs, e.cfg.Now())
			e.claimMu.Unlock()
			if err != nil {
				e.log.Error("relay claim failed", "err", err)
				if len(batch) > 0 {
					e.recordAcks(batch)
				}
				return nil
			}
			for _, rec := range recs {
				batch = append(batch, flight{rec: rec, start: time.Now()})
			}
		}
		claimed := len(batch)
		if claimed > 0 {
			e.recordAcks(batch)
		}
		e.log.Debug("relay resync", "peer", st.peer, "queried", len(offers), "held", len(held),
			"acked", claimed, "other_digest", mismatched)
		if len(held) < len(offers)/2 {
			return nil // mostly new to the peer: stream the rest
		}
		if len(offers) < wire.MaxQuerySegments {
			// Most were held and everything due was asked; what comes
			// due later may be held too.
			e.needResync(st.peer)
			return nil
		}
	}
	return nil
}

// takeResync reports whether a claim of peer's record should run the
// summary exchange for peer: once after the executor starts and after
// every connection failure or failed dial (the peer may have been
// offline), and only one at a time. A backlog that finds nothing held is
// then streamed without asking again on every stream start. Until
// endResync, no other claim takes peer's records (resyncBusy).
func (e *Executor) takeResync(peer string) bool {
	e.resyncMu.Lock()
	defer e.resyncMu.Unlock()
	if e.resynced[peer] || e.resyncing[peer] {
		return false
	}
	e.resynced[peer], e.resyncing[peer] = true, true
	return true
}

// resyncBusy reports whether peer's summary exchange is under way.
func (e *Executor) resyncBusy(peer string) bool {
	e.resyncMu.Lock()
	defer e.resyncMu.Unlock()
	return e.resyncing[peer]
}

// endResync ends peer's summary exchange (ok false: it failed, ask again
// next time) and wakes the workers for the records it left due.
func (e *Executor) endResync(peer string, ok bool) {
	e.resyncMu.Lock()
	delete(e.resyncing, peer)
	if !ok {
		delete(e.resynced, peer)
	}
	e.resyncMu.Unlock()
	e.Kick()
}

// backlogDue makes everything owed to peer due now, after a dial to it
// succeeded while its dial circuit was open, or an offer was accepted
// while its room circuit was (ledger.Expedite): what was deferred or
// backed off during the outage is summarised together at the next stream
// start instead of trickling in over a dial timeout. why ends the log
// line: what came back.
func (e *Executor) backlogDue(peer, why string) {
	e.deferMu.Lock() // after any deferral decided while the circuit was open: see applyDeferrals
	n, err := e.led.Expedite(peer, e.cfg.Now())
	e.deferMu.Unlock()
	if err != nil {
		e.log.Error("relay backlog not brought forward", "peer", peer, "err", err)
		return
	}
	if n > 0 {
		e.log.Info("relay peer "+why+": its backlog is due", "peer", peer, "records", n)
	}
	e.needResync(peer)
	e.Kick()
}

// needResync marks peer for a summary exchange at its next stream.
func (e *Executor) needResync(peer string) {
	e.resyncMu.Lock()
	defer e.resyncMu.Unlock()
	delete(e.resynced, peer)
}

// next yields the next record's segment: the queue first, then more due
// records of the peer claimed chunk by chunk. A record whose segment is
// gone is set aside as failed.
func (st *stream) next() (wire.Item, bool) {
	e := st.e
	for {
		if len(st.queue) == 0 {
			if st.probe || st.soft.Err() != nil || !e.full.closed(st.peer) {
				// A peer that refused for want of room is not offered more
				// (full.go): what is claimed already still goes.
				return wire.Item{}, false
			}
			st.queue = e.claimMore(st.peer, st.chunk)
			if len(st.queue) == 0 {
				return wire.Item{}, false
			}
		}
		rec := st.queue[0]
		st.queue = st.queue[1:]
		entry, err := e.store.Stat(rec.SegmentID)
		now := time.Now()
		if err != nil {
			if errors.Is(err, segstore.ErrNotFound) {
				err = errSegmentMissing
			}
			st.mu.Lock()
			st.missing = append(st.missing, failure{flight{rec: rec, start: now}, fmt.Errorf("deliver %s: %w", rec.SegmentID, err)})
			st.mu.Unlock()
			continue
		}
		id := entry.ID
		st.mu.Lock()
		st.inflight[id] = flight{rec: rec, size: entry.Size, start: now}
		st.mu.Unlock()
		return wire.Item{
			Offer: wire.Offer{SegmentID: id, Size: entry.Size, SHA256: entry.SHA256},
			Open: func() (io.ReadCloser, error) {
				f, _, err := e.store.Open(id)
				return f, err
			},
			// A first attempt of a small segment is pushed; after a failed
			// attempt the peer may hold the segment already (its ACK was
			// lost), so a retry is offered and costs no bytes if so.
			Push: entry.Size <= e.cfg.PushMaxBytes && rec.Attempts <= 1,
		}, true
	}
}

// done takes one result: an ACK goes to the recorder, a failure waits for
// the end of the stream.
func (st *stream) done(it wire.Item, r wire.Result) {
	st.mu.Lock()
	f := st.inflight[it.Offer.SegmentID]
	delete(st.inflight, it.Offer.SegmentID)
	st.replied = st.replied || r.Replied
	if r.Err != nil {
		st.failed = append(st.failed, failure{f, r.Err})
		st.mu.Unlock()
		if refusedForRoom(r.Err) {
			st.e.refused(st.peer, st.e.cfg.Now(), r.Err) // now, so the stream claims no more
		}
		return
	}
	st.acked = true
	st.mu.Unlock()
	st.acks <- f
}

// record writes ACKs as they arrive: whatever has accumulated since the
// last write goes in one transaction, then the success conditions.
func (st *stream) record() {
	for f := range st.acks {
		batch := []flight{f}
	drain:
		for {
			select {
			case f, ok := <-st.acks:
				if !ok {
					break drain
				}
				batch = append(batch, f)
			default:
				break drain
			}
		}
		st.e.recordAcks(batch)
		st.e.roomOK(st.peer)
	}
}

// recordAcks records a batch of ACKs in one transaction (one by one if the
// ledger refuses the batch), then their segments' success conditions.
func (e *Executor) recordAcks(batch []flight) {
	pairs := make([]ledger.Pair, len(batch))
	for i, f := range batch {
		pairs[i] = ledger.Pair{SegmentID: f.rec.SegmentID, PeerID: f.rec.PeerID}
	}
	if _, err := e.led.AckBatch(pairs, e.cfg.Now()); err != nil {
		e.log.Warn("relay ack batch not recorded; recording one by one", "err", err)
		for _, f := range batch {
			e.finish(f.rec, f.size, nil, time.Since(f.start))
		}
		return
	}
	ids := make([]string, len(batch))
	for i, f := range batch {
		elapsed := time.Since(f.start)
		e.observe(f.rec.PeerID, "acked", f.size, elapsed)
		e.log.Info("relay acked", "segment", f.rec.SegmentID, "peer", f.rec.PeerID, "attempt", f.rec.Attempts,
			"bytes", f.size, "duration", elapsed, "batch", len(batch))
		ids[i] = f.rec.SegmentID
	}
	e.checkSuccessConditions(ids)
}
