package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// Inbound floods (issue 20): a configured peer opening many connections
// at once must not multiply the receiver's memory. The receive memory
// budget (storage.receive_memory_bytes) is shared by every connection;
// what each connection costs besides it (TLS record buffers, goroutines)
// is small. Measured with -footprint (make bench) and without -race, at
// full scale: otherwise the floods run small, for their outcome only.

// floodMemoryBound is the documented bound on a receiver's peak resident
// memory with conns inbound connections at the default budget
// (docs/edge-config.md, "Inbound memory"): 24 MiB (the binary's and the
// database's pages, the runtime, the daemon's own state) plus twice (the
// Go heap's growth between collections) the two budgets (staged segments,
// QUERY and HOLDS frames) and 64 KiB per connection.
func floodMemoryBound(conns int) int64 {
	return 24<<20 + 2*(2*3<<20+int64(conns)*64<<10)
}

// measureFlood reports whether the flood runs at full scale with its
// memory checked.
func measureFlood() bool { return *footprint && !raceEnabled }

// TestQueryFlood: 256 connections from one peer (the per-peer cap) each
// send a QUERY of 4096 entries (about 1 MiB) at once. Each is answered,
// and the receiver's peak memory stays within floodMemoryBound (it
// reached 657 MiB when every connection read, decoded and answered its
// QUERY at once).
func TestQueryFlood(t *testing.T) {
	t.Parallel()
	conns := 8
	if measureFlood() {
		conns = 256
	}
	c := newCluster(t, "a", "b")
	b := c.nodes["b"]
	b.start()
	tr := rawTransport(t, filepath.Join(c.dir, "pki"), "a")
	list := make([]wire.Offer, wire.MaxQuerySegments)
	for i := range list {
		list[i] = wire.Offer{SegmentID: fmt.Sprintf("%0120d", i), Size: 1 << 20, SHA256: strings.Repeat("ab", 32)}
	}
	if p, err := wire.EncodeSegments(list); err != nil || len(p) < 512<<10 {
		t.Fatalf("query of %d bytes: %v", len(p), err)
	}
	before := rss(t, b)
	ctx := context.Background()
	open := dialMany(t, tr, b, conns)
	var wg sync.WaitGroup
	errs := make(chan error, len(open))
	for _, conn := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held, _, err := conn.Query(ctx, list)
			if err == nil && len(held) != 0 {
				err = fmt.Errorf("HOLDS names %d segments b does not hold", len(held))
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	m := rss(t, b)
	t.Logf("%d connections, a QUERY of %d entries each: b %s (before: %s)", conns, len(list), m, before)
	if bound := floodMemoryBound(conns); measureFlood() && m.peak > bound {
		t.Errorf("peak resident memory %s above the bound of %d MiB for %d connections", m, bound>>20, conns)
	}
}

// TestPushFlood: 32 connections from one peer each PUSH 32 segments of
// 64 KiB without waiting: every one is stored and acknowledged, and the
// receiver's peak memory stays within floodMemoryBound (160-184 MiB when
// each connection read up to 64 segments ahead of their commits).
func TestPushFlood(t *testing.T) {
	t.Parallel()
	conns, pushes := 4, 8
	if measureFlood() {
		conns, pushes = 32, 32
	}
	c := newCluster(t, "a", "b")
	b := c.nodes["b"]
	b.start()
	tr := rawTransport(t, filepath.Join(c.dir, "pki"), "a")
	before := rss(t, b)
	ctx := context.Background()
	open := dialMany(t, tr, b, conns)
	var wg sync.WaitGroup
	errs := make(chan error, len(open))
	for k, conn := range open {
		items := make([]wire.Item, pushes)
		for i := range items {
			body := bytes.Repeat([]byte{byte(k), byte(i)}, 32<<10)
			items[i] = wire.Item{Offer: wire.Offer{SegmentID: fmt.Sprintf("p-%03d-%03d", k, i), Size: int64(len(body)), SHA256: digest(body)},
				Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }, Push: true}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, r := range conn.DeliverWindow(ctx, items, time.Minute) {
				if r.Err != nil || !r.Sent {
					errs <- fmt.Errorf("%s: sent %v, %v", items[i].Offer.SegmentID, r.Sent, r.Err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	m := rss(t, b)
	t.Logf("%d connections, %d PUSHes of 64 KiB each: b %s (before: %s)", conns, pushes, m, before)
	if bound := floodMemoryBound(conns); measureFlood() && m.peak > bound {
		t.Errorf("peak resident memory %s above the bound of %d MiB for %d connections", m, bound>>20, conns)
	}
	if got := len(b.index()); got != conns*pushes {
		t.Errorf("b holds %d segments, want %d", got, conns*pushes)
	}
}

// dialMany opens n version 2 connections to b as the transport's node,
// closed when the test ends.
func dialMany(t *testing.T, tr interface {
	Dial(context.Context, string, string) (*wire.Conn, error)
}, b *node, n int) []*wire.Conn {
	t.Helper()
	conns := make([]*wire.Conn, n)
	for i := range conns {
		conn, err := tr.Dial(context.Background(), b.listen, b.id)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if conn.Version() < wire.Version2 {
			t.Fatalf("connection %d runs version %d", i, conn.Version())
		}
		t.Cleanup(func() { conn.Close() })
		conns[i] = conn
	}
	return conns
}
