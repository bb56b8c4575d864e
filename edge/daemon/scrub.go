package daemon

import (
	"context"
	"errors"
	"io"
	"time"

	"golang.org/x/time/rate"

	"github.com/relay-dev/relay/edge/segstore"
)

// The scrub (storage.scrub_interval, storage.scrub_rate) reads every
// stored segment back through the store's verifying Reader, so that a
// copy nobody reads to send is found damaged too: a peer's QUERY or
// re-offer is answered from the index, which would go on vouching for it.
// What it finds goes the way of any damage found on read: quarantined,
// reported, asked back from the peers (refetch.go).

// scrubChunk is how much a pass reads at a time (and the pacing's burst).
const scrubChunk = 64 << 10

// scrubLoop runs a pass every interval until ctx ends.
func (d *Daemon) scrubLoop(ctx context.Context) {
	interval := d.cfg.Storage.ScrubInterval
	if interval <= 0 {
		return
	}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.scrubPass(ctx)
		t.Reset(interval)
	}
}

// scrubPass reads every segment stored when it starts, at the configured
// pace, and logs what it checked.
func (d *Daemon) scrubPass(ctx context.Context) {
	start := time.Now()
	// The ids first: a read that finds damage writes the database, which
	// must not happen inside Each's read transaction.
	var ids []string
	if err := d.store.Each(func(e segstore.Entry) error {
		ids = append(ids, e.ID)
		return nil
	}); err != nil {
		d.log.Error("scrub: listing the stored segments failed", "err", err)
		return
	}
	lim := rate.NewLimiter(rate.Limit(d.cfg.Storage.ScrubRate), scrubChunk)
	buf := make([]byte, scrubChunk)
	var segments, damaged int
	var bytes int64
	for _, id := range ids {
		n, err := d.scrubOne(ctx, lim, buf, id)
		bytes += n
		switch {
		case ctx.Err() != nil:
			return // stopping: the pass is abandoned, not reported
		case errors.Is(err, segstore.ErrDamaged):
			damaged++
		case errors.Is(err, segstore.ErrNotFound):
			continue // evicted since the list was taken
		case err != nil:
			d.log.Warn("scrub: reading a segment failed", "segment", id, "err", err)
		}
		segments++
	}
	d.log.Info("scrub pass finished", "segments", segments, "bytes", bytes, "damaged", damaged,
		"duration", time.Since(start).Round(time.Millisecond))
}

// scrubOne reads one segment to its end through the verifying Reader.
func (d *Daemon) scrubOne(ctx context.Context, lim *rate.Limiter, buf []byte, id string) (int64, error) {
	r, _, err := d.store.Open(id)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	var read int64
	for {
		if err := lim.WaitN(ctx, len(buf)); err != nil {
			return read, err
		}
		n, err := r.Read(buf)
		read += int64(n)
		if errors.Is(err, io.EOF) {
			return read, nil
		}
		if err != nil {
			return read, err
		}
	}
}
