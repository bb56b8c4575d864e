package relay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
	bolt "go.etcd.io/bbolt"
)

// waitFor bounds every poll in these tests: generous, because -race on
// two shared cores is slow, and never a fixed sleep.
const waitFor = 20 * time.Second

func newTransport(t testing.TB, dir, id string, peers ...string) *transport.Transport {
	t.Helper()
	tr, err := transport.New(transport.Config{
		NodeID:   id,
		CertFile: filepath.Join(dir, id+".crt"), KeyFile: filepath.Join(dir, id+".key"),
		CAFile:    filepath.Join(dir, pki.CACertFile),
		AllowPeer: func(p string) bool { return slices.Contains(peers, p) },
		// Version 1: the scripted peers (newPeer) speak stop-and-wait; the
		// pipelined path has its own tests (window_test.go).
		Wire: wire.Options{IdleTimeout: time.Minute, Version: wire.Version1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// node is the sender side: a real bbolt file, ledger and segment store.
type node struct {
	db    *bolt.DB
	led   *ledger.Ledger
	store *segstore.Store
	dir   string
}

func newNode(t testing.TB) *node { return newNodeOpts(t, 1000, nil) }

// newNodeOpts is newNode with a segment quota and bbolt options.
func newNodeOpts(t testing.TB, segments int64, opts *bolt.Options) *node {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	led, err := ledger.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	st, err := segstore.Open(dir, db, segstore.Options{QuotaBytes: 1 << 30, QuotaSegments: segments, MaxSegmentBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return &node{db: db, led: led, store: st, dir: dir}
}

// put stores a segment with the given content, as if ingested locally.
func (n *node) put(t testing.TB, id string, content []byte) segstore.Entry {
	t.Helper()
	sum := sha256.Sum256(content)
	e, err := n.store.Write(id, int64(len(content)), hex.EncodeToString(sum[:]), bytes.NewReader(content), "")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// record polls the ledger until pred holds for (seg, peer).
func (n *node) waitRecord(t testing.TB, seg, peer string, pred func(ledger.Record) bool) ledger.Record {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r, err := n.led.Get(seg, peer)
		if err == nil && pred(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s/%s: condition not reached within %v; last %+v (err %v)", seg, peer, waitFor, r, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inState(s ledger.State) func(ledger.Record) bool {
	return func(r ledger.Record) bool { return r.State == s }
}

// reply is what the scripted receiver does with one received exchange.
type reply func(ctx context.Context, c *wire.Conn, o wire.Offer) (keep bool)

func ack(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
	if err := c.RecvSegment(ctx, o, io.Discard); err != nil {
		return false
	}
	return c.SendAck(ctx, o.SegmentID) == nil
}

func nack(code wire.NackCode) reply {
	return func(ctx context.Context, c *wire.Conn, o wire.Offer) bool {
		if err := c.DiscardSegment(ctx, o); err != nil {
			return false
		}
		return c.SendNack(ctx, wire.Nack{SegmentID: o.SegmentID, Code: code, Message: "scripted"}) == nil
	}
}

// peer is a scripted receiver over real mutual TLS on 127.0.0.1.
type peer struct {
	ln *transport.Listener

	mu     sync.Mutex
	script reply
	offers []string // segment ids in arrival order
	conns  int      // connections accepted
}

func newPeer(t testing.TB, tr *transport.Transport, script reply) *peer {
	t.Helper()
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{ln: ln, script: script}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, _, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns++
			p.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				defer c.Close()
				for {
					o, err := c.RecvOffer(ctx)
					if err != nil {
						return
					}
					p.mu.Lock()
					p.offers = append(p.offers, o.SegmentID)
					script := p.script
					p.mu.Unlock()
					if !script(ctx, c, o) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return p
}

func (p *peer) addr() string { return p.ln.Addr().String() }

func (p *peer) setScript(r reply) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = r
}

func (p *peer) received() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.offers)
}

// run starts ex.Run and stops it at cleanup, failing on a Run error.
func run(t testing.TB, ex *Executor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	})
}

// quietLog discards log output unless the test runs with -v.
func quietLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func testPolicy(max int) ledger.Policy {
	return ledger.Policy{MaxRetries: max, Initial: time.Millisecond, Max: 4 * time.Millisecond}
}
