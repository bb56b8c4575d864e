package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// backend implements rpc.Backend over the daemon's store and ledger.
type backend struct{ d *Daemon }

var _ rpc.Backend = backend{}

func (b backend) Status(context.Context) (rpc.Status, error) {
	d := b.d
	counts, err := d.led.Counts()
	if err != nil {
		return rpc.Status{}, err
	}
	st := rpc.Status{
		NodeID: d.cfg.NodeID, Version: d.opt.Version, StartedAt: d.started,
		Listen: d.relayLn.Addr().String(), SuccessCondition: d.cfg.Relay.SuccessCondition, AcceptFrom: d.cfg.AcceptFrom,
		EvictOnRelay: d.cfg.Relay.EvictOnRelay, Ledger: map[string]int{},
		Usage: usage(d.store.Usage()),
	}
	for _, s := range ledger.States() {
		st.Ledger[s.String()] = counts[s]
	}
	if d.api != nil {
		a := d.api.Status()
		st.RelayAPI = &a
	}
	for _, c := range d.ex.Circuits() {
		p, _ := d.cfg.Peer(c.Peer)
		rp := rpc.Peer{ID: p.ID, Address: p.Address, Circuit: string(c.State), DialFailures: c.Failures,
			Probing: c.Probing, LastDialError: c.LastError, NotDialed: c.NotDialed}
		if !c.ReopenAt.IsZero() {
			t := c.ReopenAt
			rp.ReopenAt = &t
		}
		rp.Room, rp.RoomRefusals = string(c.Room), c.RoomRefusals
		if !c.RoomReopenAt.IsZero() {
			t := c.RoomReopenAt
			rp.RoomReopenAt = &t
		}
		st.Peers = append(st.Peers, rp)
	}
	// Counted one entry at a time: a status poll must not hold the whole
	// index in memory (a device's budget; edgectl status in a loop).
	err = d.store.Each(func(e segstore.Entry) error {
		st.Segments++
		if e.Relayed {
			st.Relayed++
		}
		return nil
	})
	if err != nil {
		return rpc.Status{}, err
	}
	return st, nil
}

func segment(e segstore.Entry) rpc.Segment {
	s := rpc.Segment{ID: e.ID, Size: e.Size, SHA256: e.SHA256, Received: e.Received, Source: e.Source, Relayed: e.Relayed, Rebuilt: e.Rebuilt}
	if e.Relayed {
		t := e.RelayedAt
		s.RelayedAt = &t
	}
	return s
}

func usage(u segstore.Usage) rpc.Usage {
	return rpc.Usage{
		Bytes: u.Bytes, Segments: u.Segments, ReservedBytes: u.ReservedBytes, ReservedSegments: u.ReservedSegments,
		QuotaBytes: u.QuotaBytes, QuotaSegments: u.QuotaSegments, MaxSegmentBytes: u.MaxSegmentBytes,
		FreeBytes:    max(0, u.QuotaBytes-u.Bytes-u.ReservedBytes),
		FreeSegments: max(0, u.QuotaSegments-u.Segments-u.ReservedSegments),
	}
}

func record(r ledger.Record) rpc.Record {
	out := rpc.Record{
		Segment: r.SegmentID, Peer: r.PeerID, State: r.State.String(), Attempts: r.Attempts,
		BudgetUsed: r.BudgetUsed(), LastError: r.LastError, UpdatedAt: r.UpdatedAt,
	}
	if !r.NextAttemptAfter.IsZero() {
		t := r.NextAttemptAfter
		out.NextAttemptAfter = &t
	}
	return out
}

func (b backend) Index(context.Context) (rpc.Index, error) {
	entries, err := b.d.store.List()
	if err != nil {
		return rpc.Index{}, err
	}
	out := rpc.Index{Segments: []rpc.Segment{}}
	for _, e := range entries {
		out.Segments = append(out.Segments, segment(e))
	}
	return out, nil
}

func (b backend) Storage(context.Context) (rpc.Storage, error) {
	rep := b.d.store.Recovered()
	out := rpc.Storage{
		Dir: b.d.cfg.Storage.Dir, Usage: usage(b.d.store.Usage()),
		RemovedTemp: rep.RemovedTemp, RemovedOrphans: rep.RemovedOrphans, DroppedEntries: rep.DroppedEntries, Unknown: rep.Unknown,
		DBMovedAside: b.d.dbRepair.MovedAside, DBDamage: b.d.dbRepair.Damage, Rebuilt: rep.Rebuilt, Unverified: rep.Unverified,
		QuarantineDir: filepath.Join(b.d.cfg.Storage.Dir, segstore.QuarantineDir),
		Verified:      rep.Verified, PreviousStopClean: b.d.cleanStop, PreviousStop: b.d.previousStop(),
	}
	ps := b.d.store.PackStats()
	out.Packs = rpc.Packs{Packing: ps.Packing, MaxBytes: ps.MaxBytes, Files: ps.Files, Segments: ps.Records,
		RecordBytes: ps.RecordBytes, DiskBytes: ps.DiskBytes}
	for _, q := range b.d.store.Quarantined() {
		out.Quarantined = append(out.Quarantined, rpc.Quarantined{Segment: q.ID, File: q.File, Reason: q.Reason, Found: q.Found})
	}
	wanted, err := b.d.store.Wanted()
	if err != nil {
		return rpc.Storage{}, err
	}
	for _, w := range wanted {
		out.Wanted = append(out.Wanted, rpc.Wanted{Segment: w.ID, Size: w.Size, SHA256: w.SHA256, Source: w.Source, Since: w.Since})
	}
	return out, nil
}

func (b backend) Quota(context.Context) (rpc.Usage, error) { return usage(b.d.store.Usage()), nil }

// Records lists records in one state, all but acked (""), or all ("all"),
// ordered by (segment, peer).
func (b backend) Records(_ context.Context, state string) (rpc.Records, error) {
	state, err := rpc.FormatState(state)
	if err != nil {
		return rpc.Records{}, err
	}
	var recs []ledger.Record
	for _, s := range ledger.States() {
		if state == s.String() || state == "all" || (state == "" && s != ledger.StateAcked) {
			rs, err := b.d.led.ListByState(s)
			if err != nil {
				return rpc.Records{}, err
			}
			recs = append(recs, rs...)
		}
	}
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].SegmentID != recs[j].SegmentID {
			return recs[i].SegmentID < recs[j].SegmentID
		}
		return recs[i].PeerID < recs[j].PeerID
	})
	out := rpc.Records{Records: []rpc.Record{}}
	for _, r := range recs {
		out.Records = append(out.Records, record(r))
	}
	return out, nil
}

// Assurance judges the condition over the segment's required peers. For a
// segment no longer stored (evicted) the index entry, and with it the
// source, is gone; its required peers are then the known peers that have a
// ledger record for it, since the scheduler creates records for exactly
// the required peers. (Counting every known peer would count the source,
// which is never owed the segment, and report every segment a forwarder
// evicted as not assured.)
func (b backend) Assurance(_ context.Context, seg string) (rpc.Assurance, error) {
	d := b.d
	if err := segstore.ValidID(seg); err != nil {
		return rpc.Assurance{}, err
	}
	out := rpc.Assurance{Segment: seg, Condition: d.cfg.Relay.SuccessCondition, Records: []rpc.Record{}, AckedPeers: []string{}}
	e, err := d.store.Stat(seg)
	switch {
	case err == nil:
		out.Stored, out.Relayed = true, e.Relayed
		out.RequiredPeers = d.ex.RequiredPeers(e)
	case errors.Is(err, segstore.ErrNotFound):
	default:
		return rpc.Assurance{}, err
	}
	recs, err := d.led.ListBySegment(seg)
	if err != nil {
		return rpc.Assurance{}, err
	}
	if !out.Stored {
		out.RequiredPeers = []string{}
		for _, r := range recs { // ordered by peer id
			if _, known := d.cfg.Peer(r.PeerID); known {
				out.RequiredPeers = append(out.RequiredPeers, r.PeerID)
			}
		}
	}
	if !out.Stored && len(recs) == 0 {
		return rpc.Assurance{}, fmt.Errorf("assurance %s: %w", seg, segstore.ErrNotFound)
	}
	for _, r := range recs {
		out.Records = append(out.Records, record(r))
	}
	a, err := d.led.Assurance(seg, out.RequiredPeers, d.ex.Condition())
	if err != nil {
		return rpc.Assurance{}, err
	}
	out.Met = a.Met
	if a.AckedPeers != nil {
		out.AckedPeers = a.AckedPeers
	}
	return out, nil
}

func (b backend) RetryDeadletter(_ context.Context, sel rpc.Selector) (rpc.Deadlettered, error) {
	if err := b.checkSelector(sel); err != nil {
		return rpc.Deadlettered{}, err
	}
	recs, err := b.d.led.RetryDeadletter(sel.Segment, sel.Peer, b.d.opt.Now())
	if err != nil {
		return rpc.Deadlettered{}, err
	}
	out := deadlettered(recs)
	b.d.log.Info("deadletter retried by operator", "segment", sel.Segment, "peer", sel.Peer, "all", sel.All,
		"records", len(recs), "retried", pairs(recs))
	// The operator retries because the peers are back: their retried
	// records must not wait for the dial circuit's back-off. A named peer's
	// circuit closes even if none of its records was deadlettered (its
	// deferred ones come due at their time, then are dialled).
	peers := map[string]bool{}
	if sel.Peer != "" {
		peers[sel.Peer] = true
		b.d.ex.ResetCircuits(sel.Peer)
	}
	for _, r := range recs {
		if !peers[r.PeerID] {
			peers[r.PeerID] = true
			b.d.ex.ResetCircuits(r.PeerID)
		}
	}
	b.d.ex.Kick()
	return out, nil
}

func (b backend) PurgeDeadletter(_ context.Context, sel rpc.Selector) (rpc.Deadlettered, error) {
	if err := b.checkSelector(sel); err != nil {
		return rpc.Deadlettered{}, err
	}
	recs, err := b.d.led.Purge(sel.Segment, sel.Peer)
	if err != nil {
		return rpc.Deadlettered{}, err
	}
	b.d.log.Info("deadletter purged by operator", "segment", sel.Segment, "peer", sel.Peer, "all", sel.All,
		"records", len(recs), "purged", pairs(recs))
	return deadlettered(recs), nil
}

// checkSelector refuses a selector that names nothing (rpc.Selector.Check:
// the server checks too, this guards other callers) and one that names a
// peer or segment this node has no ledger record of, which is a typo more
// often than not; answering "0 records" would hide it. A peer removed from
// known_peers still has records, so its deadletters can be purged.
func (b backend) checkSelector(sel rpc.Selector) error {
	if err := sel.Check(); err != nil {
		return err
	}
	if sel.Peer != "" {
		if _, known := b.d.cfg.Peer(sel.Peer); !known {
			has, err := b.d.led.HasPeer(sel.Peer)
			if err != nil {
				return err
			}
			if !has {
				return fmt.Errorf("%w: peer %q is not in known_peers and has no ledger records", ledger.ErrNotFound, sel.Peer)
			}
		}
	}
	if sel.Segment != "" {
		recs, err := b.d.led.ListBySegment(sel.Segment)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("%w: segment %q has no ledger records", ledger.ErrNotFound, sel.Segment)
		}
	}
	return nil
}

func deadlettered(recs []ledger.Record) rpc.Deadlettered {
	out := rpc.Deadlettered{Count: len(recs), Records: []rpc.Record{}}
	for _, r := range recs {
		out.Records = append(out.Records, record(r))
	}
	return out
}

// pairs names records as segment/peer for a log line.
func pairs(recs []ledger.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.SegmentID + "/" + r.PeerID
	}
	return out
}

// Resend schedules a stored segment for a known peer again (the peer lost
// its copy: it found it damaged), closing the peer's dial circuit so the
// record goes out at once, as a deadletter retry does.
func (b backend) Resend(_ context.Context, req rpc.ResendRequest) (rpc.Resent, error) {
	d := b.d
	if err := segstore.ValidID(req.Segment); err != nil {
		return rpc.Resent{}, err
	}
	if _, err := d.store.Stat(req.Segment); err != nil {
		return rpc.Resent{}, fmt.Errorf("resend %s: %w (only a stored segment can be sent)", req.Segment, err)
	}
	if p, known := d.cfg.Peer(req.Peer); !known || p.Address == "" {
		return rpc.Resent{}, fmt.Errorf("resend %s: %w: peer %q is not in known_peers (accept_from peers are never dialled)", req.Segment, ledger.ErrNotFound, req.Peer)
	}
	r, resent, err := d.resend(req.Segment, req.Peer)
	if err != nil {
		return rpc.Resent{}, err
	}
	d.log.Info("relay resend by operator", "segment", req.Segment, "peer", req.Peer, "resent", resent)
	return rpc.Resent{Record: record(r), Resent: resent}, nil
}

func (b backend) Ingest(_ context.Context, id string, size int64, sum string, body io.Reader) (rpc.Ingested, error) {
	e, err := b.d.store.Write(id, size, sum, body, "")
	dup := errors.Is(err, segstore.ErrAlreadyHave)
	if err != nil && !dup {
		return rpc.Ingested{}, err
	}
	if err := b.d.ex.Schedule(e); err != nil {
		return rpc.Ingested{}, err
	}
	if !dup {
		b.d.log.Info("segment ingested", "segment", id, "bytes", size)
	}
	return rpc.Ingested{Segment: segment(e), Duplicate: dup}, nil
}

// IngestPath reads the file twice: once to hash it (the store needs the
// digest before it writes) and once to store it, verifying the digest, so
// a file that changes in between is refused rather than stored torn. Only
// files inside rpc.ingest_dirs are read (openIngest).
func (b backend) IngestPath(ctx context.Context, path, id string) (rpc.Ingested, error) {
	if !filepath.IsAbs(path) {
		return rpc.Ingested{}, fmt.Errorf("%w: path %q must be absolute (the daemon's working directory is not yours)", rpc.ErrBadRequest, path)
	}
	if id == "" {
		id = filepath.Base(path)
	}
	f, err := openIngest(b.d.cfg.RPC.IngestDirs, path)
	if err != nil {
		return rpc.Ingested{}, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return rpc.Ingested{}, err
	} else if limit := b.d.store.Usage().MaxSegmentBytes; fi.Size() > limit {
		return rpc.Ingested{}, fmt.Errorf("ingest %s: %w: %d > %d bytes", path, segstore.ErrTooLarge, fi.Size(), limit)
	}
	size, sum, err := wire.Digest(f)
	if err != nil {
		return rpc.Ingested{}, fmt.Errorf("read %s: %w", path, err)
	}
	return b.Ingest(ctx, id, size, sum, f)
}

func (b backend) Healthy() error {
	if !b.d.serving.Load() {
		return errors.New("not serving")
	}
	return nil
}
