package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"

	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// servePipelined serves a version 2 connection (docs/wire.md, "Exchanges
// in version 2"). One goroutine, this one, reads: each OFFER is answered
// at once from the store's Reserve (ACK if held, NACK if refused, ACCEPT
// otherwise), and each SEGMENT, an accepted offer's or a PUSH's (reserved
// when it arrives), is read into the store's receive memory when it is
// small (segstore.Reservation.Stage; hashed by its commit) or streamed
// into its reservation's temp file and verified (Receive). Making it
// durable (fsync, then the store's group commit) runs on a goroutine per segment,
// so the next SEGMENT is read meanwhile and segments arriving together
// share a directory fsync and an index transaction; each ACK goes out
// when its own commit returned, in whatever order they finish.
func (d *Daemon) servePipelined(ctx context.Context, c *wire.Conn, log *slog.Logger, peer string) {
	var commits sync.WaitGroup
	reserved := map[string]*segstore.Reservation{}
	defer func() {
		if len(reserved) > 0 && ctx.Err() == nil {
			// Accepted offers whose SEGMENT never came: the sender went
			// away, stalled or broke the protocol first. Each offer gets a
			// result in edged_inbound_segments_total.
			d.met.inbound.WithLabelValues("aborted").Add(float64(len(reserved)))
			log.Info("connection ended before the segments of accepted offers arrived; nothing stored", "offers", len(reserved))
		}
		for _, r := range reserved {
			r.Release()
		}
		// Commits in flight finish (a stored segment is scheduled even if
		// its ACK can no longer be sent) before the handler returns.
		c.Close()
		commits.Wait()
	}()
	for {
		req, err := c.RecvRequest(ctx)
		if err != nil {
			d.requestFailed(ctx, c, log, err)
			return
		}
		if req.Query != nil {
			if err := c.SendHolds(ctx, d.holds(req.Query)); err != nil {
				log.Debug("holds not sent", "err", err)
				return
			}
			continue
		}
		if req.Want != nil {
			if err := c.SendHolds(ctx, d.grant(log, peer, req.Want)); err != nil {
				log.Debug("holds not sent", "err", err)
				return
			}
			continue
		}
		o := req.Offer
		slog := log.With("segment", o.SegmentID, "bytes", o.Size)
		if !req.Segment {
			if !d.answerOffer(ctx, c, slog, peer, o, reserved) {
				return
			}
			continue
		}
		var res *segstore.Reservation
		if req.Pushed {
			var ok bool
			if res, ok = d.reservePushed(ctx, c, slog, peer, o); res == nil {
				if !ok {
					return
				}
				continue
			}
		} else {
			res = reserved[o.SegmentID]
			delete(reserved, o.SegmentID)
		}
		if o.Size <= smallSegment {
			// Read it into the store's receive memory, once there is room
			// for it (segstore.Reservation.Stage: the wait is this node's,
			// so it does not count against the peer's transfer deadline),
			// and leave the hash and the pack record or file to the commit
			// goroutine (below).
			staged, err := res.Stage(ctx, peer)
			if err != nil {
				d.segmentFailed(ctx, c, slog, o, err) // stopping
				return
			}
			sctx, cancel := d.segmentContext(ctx, o.Size)
			rerr := c.RecvPayload(sctx, o, staged.Fill)
			cancel()
			if rerr != nil {
				d.segmentFailed(ctx, c, slog, o, rerr)
				return
			}
			commits.Add(1)
			go func() {
				defer commits.Done()
				d.commitAndAck(ctx, c, slog, o, staged)
			}()
			continue
		}
		var staged *segstore.Staged
		inStep := false // the whole frame was read although Receive failed
		sctx, cancel := d.segmentContext(ctx, o.Size)
		rerr := c.RecvPayload(sctx, o, func(r io.Reader) error {
			var err error
			staged, err = res.Receive(r, peer)
			switch {
			case errors.Is(err, segstore.ErrChecksum):
				inStep = true // it read the whole frame before comparing
			case err != nil && o.Size <= discardLimit && sctx.Err() == nil && !wire.PeerAborted(err) && !timedOut(err):
				// A local failure (the disk refused a write) in the middle
				// of the frame: read the rest and drop it, so that the
				// NACK reaches the sender and the window goes on, rather
				// than a close that resets the connection under it.
				if _, derr := io.Copy(io.Discard, r); derr == nil {
					inStep = true
				}
			}
			return err
		})
		cancel()
		if rerr != nil {
			if inStep {
				// The whole frame was read: the connection stays in step.
				if !d.refusePipelined(ctx, c, slog, o, nackCode(rerr), rerr) {
					return
				}
				continue
			}
			d.segmentFailed(ctx, c, slog, o, rerr)
			return
		}
		commits.Add(1)
		go func() {
			defer commits.Done()
			d.commitAndAck(ctx, c, slog, o, staged)
		}()
	}
}

// smallSegment: a SEGMENT up to this size is read by the connection's
// reader into the store's receive memory (storage.receive_memory_bytes,
// one budget for the process) and hashed and written to its pack or temp
// file by the commit goroutine, so that hashing and creating files (about
// a millisecond each on a busy ext4, far less when several run at once)
// do not serialise a stream of small segments. When the budget is in
// use the reader waits for it: the senders' bytes wait in the network,
// not in this process's heap.
const smallSegment = 64 << 10

// segmentFailed handles a SEGMENT that could not be read whole: the peer
// went away, or a local failure (or a stop) left the rest of the frame
// unread, in which case the peer is told and the connection closed.
func (d *Daemon) segmentFailed(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, err error) {
	if d.peerGone(ctx, log, err) {
		return
	}
	d.refusePipelined(ctx, c, log, o, nackCode(err), err)
}

// commitAndAck makes a staged segment durable, schedules it for onward
// delivery and only then sends its ACK.
func (d *Daemon) commitAndAck(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, staged *segstore.Staged) {
	e, err := staged.Commit()
	if err != nil {
		d.refusePipelined(ctx, c, log, o, nackCode(err), err)
		return
	}
	if err := d.ex.Schedule(e); err != nil {
		log.Error("stored but not scheduled; start-up reconciliation will schedule it", "err", err)
	}
	d.met.inbound.WithLabelValues("stored").Inc()
	log.Debug("segment stored")
	if err := c.SendAck(ctx, o.SegmentID); err != nil {
		log.Debug("ack not sent", "err", err)
		c.Close() // the write side is broken: stop reading too
	}
}

// answerOffer replies to one OFFER before any of its bytes move: ACK when
// the segment is already held with this digest, NACK when the store
// refuses it, ACCEPT otherwise (holding the reservation until its SEGMENT
// arrives). It reports whether the connection is still usable.
func (d *Daemon) answerOffer(ctx context.Context, c *wire.Conn, log *slog.Logger, peer string, o wire.Offer, reserved map[string]*segstore.Reservation) bool {
	res, err := d.store.ReserveFrom(peer, o.SegmentID, o.Size, o.SHA256)
	if err != nil {
		return d.decline(ctx, c, log, o, err)
	}
	reserved[o.SegmentID] = res
	if err := c.SendAccept(ctx, o); err != nil {
		log.Debug("accept not sent", "err", err)
		return false
	}
	return true
}

// reservePushed reserves room for a PUSHed segment, whose bytes follow
// unasked. When the store already holds it with this digest, or refuses
// it, the bytes are read and dropped and the answer is ACK or NACK, as
// for an OFFER (nil reservation); ok reports whether the connection is
// still usable.
func (d *Daemon) reservePushed(ctx context.Context, c *wire.Conn, log *slog.Logger, peer string, o wire.Offer) (res *segstore.Reservation, ok bool) {
	res, err := d.store.ReserveFrom(peer, o.SegmentID, o.Size, o.SHA256)
	if err == nil {
		return res, true
	}
	sctx, cancel := d.segmentContext(ctx, o.Size)
	defer cancel()
	if rerr := c.RecvPayload(sctx, o, func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }); rerr != nil {
		d.segmentFailed(ctx, c, log, o, rerr)
		return nil, false
	}
	return nil, d.decline(ctx, c, log, o, err)
}

// decline answers an offer or a push the store would not reserve (err):
// ACK when it already holds the segment with this digest (the durable
// claim; no bytes need to move, or the pushed ones were dropped), NACK
// otherwise. It reports whether the connection is still usable.
func (d *Daemon) decline(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, err error) bool {
	if errors.Is(err, segstore.ErrAlreadyHave) {
		d.met.inbound.WithLabelValues("duplicate").Inc()
		log.Debug("segment already held; declined with ACK")
		return c.SendAck(ctx, o.SegmentID) == nil
	}
	return d.refusePipelined(ctx, c, log, o, nackCode(err), err)
}

// refusePipelined answers NACK; in version 2 no SEGMENT follows a refused
// offer, and one whose bytes were read already was consumed whole.
func (d *Daemon) refusePipelined(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, code wire.NackCode, cause error) bool {
	d.refused(ctx, log, code, cause)
	return d.nack(ctx, c, log, wire.Nack{SegmentID: o.SegmentID, Code: code, Message: cause.Error()})
}

// requestFailed reports why reading the next request ended the
// connection (both protocol versions).
func (d *Daemon) requestFailed(ctx context.Context, c *wire.Conn, log *slog.Logger, err error) {
	reason, violation := wire.ProtocolViolation(err)
	switch {
	case errors.Is(err, io.EOF), ctx.Err() != nil:
		// Closed between exchanges, or this daemon is stopping.
	case violation:
		d.protocolError(log, reason, err)
		if errors.Is(err, wire.ErrBadMessage) {
			// The frame was whole, so the peer can be told; what follows
			// it cannot be delimited safely.
			d.nack(ctx, c, log, wire.Nack{Code: wire.NackBadRequest, Message: err.Error()})
		}
	case wire.PeerAborted(err):
		log.Info("peer closed the connection inside a frame", "err", err)
	default:
		log.Debug("relay connection ended", "err", err)
	}
}

// holds answers a QUERY: the queried segments this node durably holds
// (committed index entries) with exactly the queried size and digest. A
// segment held with another digest is not named: the sender offers it,
// and the offer is refused as a conflict, never taken as delivered.
func (d *Daemon) holds(query []wire.Offer) []wire.Offer {
	var held []wire.Offer
	for _, o := range query {
		e, err := d.store.Stat(o.SegmentID)
		if err == nil && e.Size == o.Size && e.SHA256 == o.SHA256 {
			held = append(held, o)
		}
	}
	d.met.inbound.WithLabelValues("duplicate").Add(float64(len(held)))
	return held
}
