package daemon

import (
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/takedown"
)

// Takedown is what Daemon.Takedown did: the tombstone and the signed
// receipt for the request (one line of a receipt file).
type Takedown struct {
	Tombstone segstore.Tombstone
	Receipt   takedown.Signed
	// Evicted: this call removed the segment (false: taken down before).
	Evicted bool
	// Cancelled counts the delivery records this call cancelled.
	Cancelled int
}

// Takedown evicts a stored segment for takedown request, the one entry
// point for every caller: the operator's RPC (edgectl takedown evict) and
// the relay's order puller (edge/relayapi). In one database transaction it removes
// the segment's index entry, cancels its delivery records to every peer
// (ledger.CancelSegmentIn: not failed, not retried), records its tombstone
// (every later offer of the id is refused with NACK evicted, every ingest
// with 409) and stores the receipt, signed with the node key this daemon
// uses for mutual TLS and checked against the node's own CA file before
// the transaction commits. The file or pack record goes after the commit;
// a crash in between leaves an orphan the next start removes. So after
// any crash the takedown either did not happen or is complete with its
// receipt.
//
// Idempotent per (segment, request): the same request again returns the
// stored receipt and changes nothing. Another request for a segment taken
// down already gets a receipt of its own for that same eviction (same
// digest and time). A segment this node neither holds nor took down is
// segstore.ErrNotFound and nothing is signed: a receipt proves the
// eviction of content the node held, and the relay must not be handed one
// for a digest the node never had. A request id breaking
// takedown.CheckRequestID is refused before anything is read. If the
// certificate cannot sign a receipt that verifies (expired, not a node
// certificate of the configured CA), nothing is evicted: renew it (edged
// picks up new files at the next handshake, or on SIGHUP) and ask again.
func (d *Daemon) Takedown(segmentID, request string) (Takedown, error) {
	out, err := d.takedown(segmentID, request)
	if err == nil && d.api != nil {
		d.api.Changed() // post the receipt, report the eviction
	}
	switch {
	case err != nil:
		d.met.takedowns.WithLabelValues("refused").Inc()
		d.log.Warn("takedown refused", "segment", segmentID, "request", request, "err", err)
	case out.Evicted:
		d.met.takedowns.WithLabelValues("evicted").Inc()
		d.log.Info("segment taken down", "segment", segmentID, "request", request, "sha256", out.Tombstone.SHA256,
			"bytes", out.Tombstone.Size, "records_cancelled", out.Cancelled)
	default:
		d.met.takedowns.WithLabelValues("receipt").Inc()
		d.log.Info("segment taken down before; receipt returned", "segment", segmentID, "request", request,
			"evicted_at", out.Tombstone.EvictedAt)
	}
	return out, err
}

func (d *Daemon) takedown(segmentID, request string) (Takedown, error) {
	if err := takedown.CheckRequestID(request); err != nil {
		return Takedown{}, fmt.Errorf("takedown %s: %w: %v", segmentID, rpc.ErrBadRequest, err)
	}
	m := d.tr.Material()
	var out Takedown
	seal := func(tx *bolt.Tx, t segstore.Tombstone, req string) ([]byte, error) {
		r := takedown.Receipt{Request: req, ContentID: t.ID, SHA256: t.SHA256, Node: d.cfg.NodeID, EvictedAt: t.EvictedAt}
		s, err := takedown.Sign(r, m.Cert)
		if err != nil {
			return nil, err
		}
		if _, err := takedown.Verify(s, m.Pool, d.opt.Now()); err != nil {
			return nil, fmt.Errorf("node certificate cannot sign a receipt that verifies: %w", err)
		}
		n, err := d.led.CancelSegmentIn(tx, t.ID, "segment evicted here for takedown request "+req, d.opt.Now())
		if err != nil {
			return nil, err
		}
		out.Cancelled += n
		return s.MarshalLine(), nil
	}
	res, err := d.store.Takedown(segmentID, request, seal)
	if err != nil && !res.Evicted {
		return Takedown{}, err
	}
	// With res.Evicted and an error, the takedown committed and only the
	// removal of its content failed (the next start finishes it).
	s, perr := takedown.ParseLine(res.Receipt)
	if perr != nil {
		return Takedown{}, fmt.Errorf("takedown %s: stored receipt: %w", segmentID, perr)
	}
	out.Tombstone, out.Receipt, out.Evicted = res.Tombstone, s, res.Evicted
	if err != nil {
		d.log.Warn("segment taken down; its content is removed at the next start", "segment", segmentID, "err", err)
	}
	return out, nil
}

// Takedown is POST /v1/takedown/evict.
func (b backend) Takedown(_ context.Context, req rpc.TakedownRequest) (rpc.TakedownReply, error) {
	if err := segstore.ValidID(req.Segment); err != nil {
		return rpc.TakedownReply{}, err
	}
	t, err := b.d.Takedown(req.Segment, req.Request)
	if errors.Is(err, segstore.ErrNotFound) {
		return rpc.TakedownReply{}, fmt.Errorf("%w: this node neither holds nor took down segment %s: no receipt is signed for content it never had", err, req.Segment)
	}
	if err != nil {
		return rpc.TakedownReply{}, err
	}
	return rpc.TakedownReply{
		Segment: req.Segment, Request: req.Request, SHA256: t.Tombstone.SHA256, Size: t.Tombstone.Size,
		EvictedAt: t.Tombstone.EvictedAt, Evicted: t.Evicted, Cancelled: t.Cancelled, Receipt: string(t.Receipt.MarshalLine()),
	}, nil
}

// Receipts is GET /v1/takedown/receipts.
func (b backend) Receipts(_ context.Context, segment string) (rpc.Receipts, error) {
	if segment != "" {
		if err := segstore.ValidID(segment); err != nil {
			return rpc.Receipts{}, err
		}
	}
	rs, err := b.d.store.Receipts(segment)
	if err != nil {
		return rpc.Receipts{}, err
	}
	out := rpc.Receipts{Receipts: []rpc.Receipt{}}
	for _, r := range rs {
		x := rpc.Receipt{Segment: r.ID, Request: r.Request, Receipt: string(r.Receipt)}
		if s, err := takedown.ParseLine(r.Receipt); err == nil {
			x.SHA256, x.EvictedAt = s.Receipt.SHA256, s.Receipt.EvictedAt
		}
		out.Receipts = append(out.Receipts, x)
	}
	return out, nil
}

// stored is the store's OnCommit: a segment committed (received, ingested,
// fetched back) is reported to the relay's takedown owner within
// relay_api.report_delay, so a node that stores content after its
// takedown was requested is seen as a late holder in seconds.
func (d *Daemon) stored(e segstore.Entry) {
	if d.api != nil {
		d.api.Stored(e.ID)
	}
}
