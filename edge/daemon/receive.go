package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// acceptLoop hands every authenticated inbound connection to
// handleRelayConn until ctx ends, then waits for the handlers. A peer
// holding Options.MaxConnsPerPeer connections already has the next one
// closed at once: each costs a goroutine and buffers, and a configured
// peer is trusted with segments, not with this daemon's memory.
func (d *Daemon) acceptLoop(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	open := map[string]int{}
	for {
		c, peer, err := d.relayLn.Accept()
		if err != nil {
			return // closed: the daemon is stopping
		}
		mu.Lock()
		full := open[peer] >= d.opt.MaxConnsPerPeer
		if !full {
			open[peer]++
		}
		mu.Unlock()
		if full {
			c.Close()
			d.met.rejected.Inc()
			d.log.Warn("inbound connection refused", "peer", peer, "remote", addrString(c.RemoteAddr()),
				"err", fmt.Sprintf("peer already holds %d connections", d.opt.MaxConnsPerPeer))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				if open[peer]--; open[peer] == 0 {
					delete(open, peer)
				}
			}()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			d.handleRelayConn(ctx, c, peer)
		}()
	}
}

// discardLimit: a refused segment up to this size is read and dropped so
// the connection stays usable; a larger one is refused and the connection
// closed, rather than reading up to 4 GiB for nothing (docs/wire.md
// allows either).
const discardLimit = 1 << 20

// handleRelayConn serves one inbound connection: any number of OFFER,
// SEGMENT, ACK|NACK exchanges from an authenticated, configured peer.
//
// Per exchange: reserve quota for the offer (segstore.Reserve: already
// held, size, quota), stream the SEGMENT into the store's commit path
// (temp file, digest check, fsync, rename, directory fsync, index entry)
// and only then ACK. A segment already held with the same digest is
// acknowledged again. Every refusal is a NACK with its code, and leaves
// nothing stored; one bad exchange closes at most its own connection.
func (d *Daemon) handleRelayConn(ctx context.Context, c *wire.Conn, peer string) {
	defer c.Close()
	log := d.log.With("peer", peer, "remote", addrString(c.RemoteAddr()))
	log.Debug("relay connection accepted", "version", c.Version())
	if c.Version() >= wire.Version2 {
		d.servePipelined(ctx, c, log, peer)
		return
	}
	for {
		o, err := c.RecvOffer(ctx)
		if err != nil {
			d.requestFailed(ctx, c, log, err)
			return
		}
		if !d.receive(ctx, c, log.With("segment", o.SegmentID, "bytes", o.Size), peer, o) {
			return
		}
	}
}

// receive runs one exchange and reports whether the connection is still
// in step for the next one.
func (d *Daemon) receive(ctx context.Context, c *wire.Conn, log *slog.Logger, peer string, o wire.Offer) bool {
	res, err := d.store.ReserveFrom(peer, o.SegmentID, o.Size, o.SHA256)
	if errors.Is(err, segstore.ErrAlreadyHave) {
		// Idempotent: the sender's earlier ACK was lost or late.
		if err := c.DiscardSegment(ctx, o); err != nil {
			d.discardFailed(ctx, log, err)
			return false
		}
		d.met.inbound.WithLabelValues("duplicate").Inc()
		log.Debug("segment already held; acknowledging again")
		return c.SendAck(ctx, o.SegmentID) == nil
	}
	if err != nil {
		return d.refuse(ctx, c, log, o, nackCode(err), err, false)
	}
	defer res.Release()

	// The store reads the SEGMENT's payload straight from the wire and
	// verifies its digest while writing (hashing on another goroutine):
	// each byte is hashed once.
	var staged *segstore.Staged
	sctx, cancel := d.segmentContext(ctx, o.Size)
	defer cancel()
	rerr := c.RecvSegmentPayload(sctx, o, func(r io.Reader) error {
		var err error
		staged, err = res.Receive(r, peer)
		return err
	})
	switch {
	case rerr != nil && errors.Is(rerr, segstore.ErrChecksum):
		// The store read the whole frame before comparing digests: the
		// connection stays in step.
		return d.refuse(ctx, c, log, o, wire.NackChecksum, rerr, true)
	case rerr != nil && d.peerGone(ctx, log, rerr):
		// The store removed the partial file when Receive saw the error.
		return false
	case rerr != nil:
		if reason, ok := wire.ProtocolViolation(rerr); ok {
			// A SEGMENT of another length than offered, or another frame
			// where the SEGMENT was due: tell the peer, then close.
			d.protocolError(log, reason, rerr)
			d.met.inbound.WithLabelValues("refused").Inc()
			d.nack(ctx, c, log, wire.Nack{SegmentID: o.SegmentID, Code: wire.NackBadRequest, Message: rerr.Error()})
			return false
		}
		// Out of step for a local reason (a disk failure in the middle of
		// the frame) or because this daemon is stopping. Tell the peer if
		// we can, then close.
		d.refuse(ctx, c, log, o, nackCode(rerr), rerr, true)
		return false
	}
	e, err := staged.Commit()
	if err != nil {
		// The whole frame was read; the commit failed after.
		return d.refuse(ctx, c, log, o, nackCode(err), err, true)
	}
	// Durable and indexed: schedule onward delivery before the ACK, so a
	// crash after the ACK cannot leave it unscheduled (reconciliation
	// would catch it anyway).
	if err := d.ex.Schedule(e); err != nil {
		log.Error("stored but not scheduled; start-up reconciliation will schedule it", "err", err)
	}
	d.met.inbound.WithLabelValues("stored").Inc()
	log.Debug("segment stored")
	return c.SendAck(ctx, o.SegmentID) == nil
}

// segmentContext bounds the reading of one SEGMENT payload of size
// bytes: the idle timeout plus its size at relay.inbound_min_rate. The
// idle timeout alone is renewed by every byte, so a peer sending one
// byte a minute could hold the segment's quota reservation for as long
// as it liked (issue 20: one byte every 40 s kept 64 MiB reserved for
// over 4 minutes).
func (d *Daemon) segmentContext(ctx context.Context, size int64) (context.Context, context.CancelFunc) {
	atRate := time.Duration(size) * time.Second / time.Duration(d.cfg.Relay.InboundMinRate)
	return context.WithTimeout(ctx, idleTimeout(d.cfg, d.opt.IdleTimeout)+atRate)
}

// peerGone reports, and counts as aborted, a SEGMENT the peer stopped
// sending: it went away (crashed, killed, network cut: wire.PeerAborted)
// or stalled, sending nothing within the idle timeout or too little
// within the segment's deadline (segmentContext). Either is the sender's
// failure, not this node's, so it is never NACKed internal; nothing is
// sent (a peer that went away is not listening, and the stream is out of
// step either way) and the connection is closed. It is false while this
// daemon is stopping: that is nobody's failure.
func (d *Daemon) peerGone(ctx context.Context, log *slog.Logger, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch {
	case wire.PeerAborted(err):
		log.Warn("peer aborted the segment; nothing stored", "err", err)
	case timedOut(err):
		log.Warn("peer stalled the segment (no byte within the idle timeout, or slower than relay.inbound_min_rate); nothing stored",
			"err", err)
	default:
		return false
	}
	d.met.inbound.WithLabelValues("aborted").Inc()
	return true
}

// timedOut reports a read that ran into its deadline: the connection's
// idle timeout (os.ErrDeadlineExceeded) or the segment's own
// (context.DeadlineExceeded).
func timedOut(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// refused counts and logs a refusal: at warn, but for busy, which needs
// no operator (another copy is arriving and will most likely be stored).
func (d *Daemon) refused(ctx context.Context, log *slog.Logger, code wire.NackCode, cause error) {
	d.met.inbound.WithLabelValues("refused").Inc()
	level := slog.LevelWarn
	if code == wire.NackBusy {
		level = slog.LevelInfo
	}
	log.Log(ctx, level, "segment refused", "code", string(code), "err", cause)
}

// refuse answers NACK. When the SEGMENT frame was not consumed yet, a
// small one is read and dropped so the connection stays usable, and a
// large one ends the connection. It reports whether the connection is
// still in step.
func (d *Daemon) refuse(ctx context.Context, c *wire.Conn, log *slog.Logger, o wire.Offer, code wire.NackCode, cause error, consumed bool) bool {
	d.refused(ctx, log, code, cause)
	if !d.nack(ctx, c, log, wire.Nack{SegmentID: o.SegmentID, Code: code, Message: cause.Error()}) {
		return false
	}
	if consumed {
		return true
	}
	if o.Size > discardLimit || code == wire.NackTooLarge {
		return false
	}
	if err := c.DiscardSegment(ctx, o); err != nil {
		d.discardFailed(ctx, log, err)
		return false
	}
	return true
}

// discardFailed reports why reading a SEGMENT to drop it failed: the peer
// broke the protocol, went away, or (debug) a timeout or a stop.
func (d *Daemon) discardFailed(ctx context.Context, log *slog.Logger, err error) {
	if reason, ok := wire.ProtocolViolation(err); ok {
		d.protocolError(log, reason, err)
		return
	}
	if ctx.Err() == nil && wire.PeerAborted(err) {
		log.Info("peer closed the connection inside a segment it offered", "err", err)
		return
	}
	log.Debug("relay connection ended", "err", err)
}

// protocolError records an authenticated, configured peer sending what the
// protocol does not allow (an unknown frame type, an oversized length, a
// frame out of order, a malformed message). The connection is closed
// either way; the warning and edged_inbound_protocol_errors_total{reason}
// tell the operator that a peer runs broken or hostile software, which
// a debug line did not.
func (d *Daemon) protocolError(log *slog.Logger, reason string, err error) {
	d.met.protocolErrors.WithLabelValues(reason).Inc()
	log.Warn("protocol error from peer; closing the connection", "reason", reason, "err", err)
}

func (d *Daemon) nack(ctx context.Context, c *wire.Conn, log *slog.Logger, n wire.Nack) bool {
	// A code the peer's version lacks (evicted, before version 4) would
	// make it refuse the whole NACK as malformed; it is told bad_request.
	n.Code = wire.NackFor(n.Code, c.Version())
	d.met.nacks.WithLabelValues(string(n.Code)).Inc()
	if err := c.SendNack(ctx, n); err != nil {
		log.Debug("nack not sent", "err", err)
		return false
	}
	return true
}

// nackCode maps a store error to the NACK code of docs/wire.md.
func nackCode(err error) wire.NackCode {
	switch {
	case errors.Is(err, segstore.ErrQuota), errors.Is(err, segstore.ErrSourceShare):
		// The sender's own unfinished segments hold its share: as for a
		// full store, it is told to retry later.
		return wire.NackQuota
	case errors.Is(err, segstore.ErrTooLarge):
		return wire.NackTooLarge
	case errors.Is(err, segstore.ErrChecksum):
		return wire.NackChecksum
	case errors.Is(err, segstore.ErrEvicted):
		// Taken down here: refused for good (bad_request to a peer older
		// than version 4, see nack).
		return wire.NackEvicted
	case errors.Is(err, segstore.ErrInvalid), errors.Is(err, segstore.ErrDigestConflict), errors.Is(err, segstore.ErrSize):
		return wire.NackBadRequest
	case errors.Is(err, segstore.ErrBusy):
		// Another copy of the segment is being taken in (another
		// peer's, or this sender's earlier attempt still arriving):
		// not a failure of the receiver, so not internal, which the
		// sender counts against its retry budget. quota before version
		// 5 (see nack).
		return wire.NackBusy
	}
	return wire.NackInternal // disk errors: retry later
}
