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
// otherwise), and each SEGMENT is streamed into its reservation's temp
// file and verified (segstore.Reservation.Receive). Making it durable
// (fsync, then the store's group commit) runs on a goroutine per segment,
// so the next SEGMENT is read meanwhile and segments arriving together
// share a directory fsync and an index transaction; each ACK goes out
// when its own commit returned, in whatever order they finish.
func (d *Daemon) servePipelined(ctx context.Context, c *wire.Conn, log *slog.Logger, peer string) {
	var commits sync.WaitGroup
	reserved := map[string]*segstore.Reservation{}
	defer func() {
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
		o := req.Offer
		slog := log.With("segment", o.SegmentID, "bytes", o.Size)
		if !req.Segment {
			if !d.answerOffer(ctx, c, slog, o, reserved) {
				return
			}
			continue
		}
		res := reserved[o.SegmentID]
		delete(reserved, o.SegmentID)
		var staged *segstore.Staged
		rerr := c.RecvPayload(ctx, o, func(r io.Reader) error {
			var err error
			staged, err = res.Receive(r, peer)
			return err
		})
		switch {
		case rerr == nil:
		case errors.Is(rerr, segstore.ErrChecksum):
			// The whole frame was read: the connection stays in step.
			if !d.refusePipelined(ctx, c, slog, o, wire.NackChecksum, rerr) {
				return
			}
			continue
		case ctx.Err() == nil && wire.PeerAborted(rerr):
			d.met.inbound.WithLabelValues("aborted").Inc()
			slog.Warn("peer aborted the segment; nothing stored", "err", rerr)
			return
		default:
			// A local failure in the middle of the frame, or a stop: the
			// rest of the SEGMENT was not read, so tell the peer and close.
			d.refusePipelined(ctx, c, slog, o, nackCode(rerr), rerr)
			return
		}
		commits.Add(1)
		go func() {
			defer commits.Done()
			e, err := staged.Commit()
			if err != nil {
				d.refusePipelined(ctx, c, slog, o, nackCode(err), err)
				return
			}
			if err := d.ex.Schedule(e); err != nil {
				slog.Error("stored but not scheduled; start-up reconciliation will schedule it", "err", err)
			}
			d.met.inbound.WithLabelValues("stored").Inc()
			slog.Debug("segment stored")
			if err := c.SendAck(ctx, o.SegmentID); err != nil {
				slog.Debug("ack not sent", "err", err)
				c.Close() // the write side is broken: stop reading too
			}
		}()
	}
}

// answerOffer replies to one OFFER before any of its bytes move: ACK when
// the segment is already held with this digest, NACK when the store
// refuses it, ACCEPT otherwise (holding the reservation until its SEGMENT
// arrives). It reports whether the connection is still usable.
func (d *Daemon) answerOffer(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, reserved map[string]*segstore.Reservation) bool {
	res, err := d.store.Reserve(o.SegmentID, o.Size, o.SHA256)
	switch {
	case errors.Is(err, segstore.ErrAlreadyHave):
		d.met.inbound.WithLabelValues("duplicate").Inc()
		log.Debug("segment already held; declined with ACK")
		return c.SendAck(ctx, o.SegmentID) == nil
	case err != nil:
		return d.refusePipelined(ctx, c, log, o, nackCode(err), err)
	}
	reserved[o.SegmentID] = res
	if err := c.SendAccept(ctx, o); err != nil {
		log.Debug("accept not sent", "err", err)
		return false
	}
	return true
}

// refusePipelined answers NACK; in version 2 no SEGMENT follows a refused
// offer, and one whose bytes were read already was consumed whole.
func (d *Daemon) refusePipelined(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, code wire.NackCode, cause error) bool {
	d.met.inbound.WithLabelValues("refused").Inc()
	log.Warn("segment refused", "code", string(code), "err", cause)
	return d.nack(ctx, c, log, wire.Nack{SegmentID: o.SegmentID, Code: code, Message: cause.Error()})
}

// requestFailed reports why reading the next request ended the
// connection, as handleRelayConn does for version 1.
func (d *Daemon) requestFailed(ctx context.Context, c *wire.Conn, log *slog.Logger, err error) {
	reason, violation := wire.ProtocolViolation(err)
	switch {
	case errors.Is(err, io.EOF), ctx.Err() != nil:
	case violation:
		d.protocolError(log, reason, err)
		if errors.Is(err, wire.ErrBadMessage) {
			d.nack(ctx, c, log, wire.Nack{Code: wire.NackBadRequest, Message: err.Error()})
		}
	case wire.PeerAborted(err):
		log.Info("peer closed the connection inside a frame", "err", err)
	default:
		log.Debug("relay connection ended", "err", err)
	}
}
