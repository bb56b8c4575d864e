package takedowns_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// clock is the relay's clock in these tests: it starts ten minutes after
// the real time (the dev certificates are valid from five minutes before
// it, so a receipt may be dated well before a request) and moves only when
// a test says so.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// counting counts the batches applied (or maybe applied) to a real
// store: a refusal must apply none. A batch refused on its preconditions
// changed nothing and is not counted.
type counting struct {
	relaycore.Store
	applies, reads atomic.Int64
	// fault, when set (by a test, between calls), answers a batch before
	// the store sees it: a non-nil error refuses it unapplied.
	fault func(relaycore.Batch) error
}

func (c *counting) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	c.reads.Add(1)
	return c.Store.Get(ctx, p, key)
}

func (c *counting) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	c.reads.Add(1)
	return c.Store.Scan(ctx, p, req)
}

func (c *counting) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if c.fault != nil {
		if err := c.fault(b); err != nil {
			return err
		}
	}
	err := c.Store.Apply(ctx, p, b)
	if err == nil || relaycore.MayBeApplied(err) {
		c.applies.Add(1)
	}
	return err
}

type env struct {
	t        testing.TB
	ctx      context.Context
	clock    *clock
	src, dst *counting
	relay    *relaycore.RelayHandler
	o        *takedowns.Owner
	pki      string // the CA directory: nodes edge-a, edge-b, edge-c
	nodes    map[string]bool
}

const overdue = time.Hour

// stores are the real stores the tests run on.
var stores = map[string]func(t testing.TB) (src, dst relaycore.Store){
	"mem": func(testing.TB) (relaycore.Store, relaycore.Store) {
		return mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	},
	"bolt": func(t testing.TB) (relaycore.Store, relaycore.Store) {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db.Store("source"), db.Store("target")
	},
	"dynamo": func(t testing.TB) (relaycore.Store, relaycore.Store) {
		ep := dynamotest.Start(t)
		client := ep.Client(nil)
		for _, tbl := range []string{"src", "tgt"} {
			if err := dynamo.CreateTable(context.Background(), client, tbl); err != nil {
				t.Fatal(err)
			}
		}
		return dynamo.New(client, "src", dynamo.Options{}), dynamo.New(client, "tgt", dynamo.Options{})
	},
}

func forEachStore(t *testing.T, f func(t *testing.T, e *env)) {
	for _, name := range []string{"mem", "bolt", "dynamo"} {
		t.Run(name, func(t *testing.T) {
			src, dst := stores[name](t)
			f(t, newEnv(t, src, dst))
		})
	}
}

func newEnv(t testing.TB, src, dst relaycore.Store) *env {
	e := &env{t: t, ctx: context.Background(), clock: &clock{t: time.Now().Add(10 * time.Minute).Truncate(time.Millisecond)},
		src: &counting{Store: src}, dst: &counting{Store: dst}, nodes: map[string]bool{}}
	e.pki = pkitest.New(t, "edge-a", "edge-b", "edge-c")
	e.relay = &relaycore.RelayHandler{Source: e.src, Target: e.dst, Clock: e.clock, Hook: takedowns.Hook{Delay: overdue}}
	e.o = &takedowns.Owner{Relay: e.relay, Roots: caPool(t, e.pki)}
	return e
}

func caPool(t testing.TB, dir string) *x509.CertPool {
	b, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatal("no CA certificate")
	}
	return p
}

func (e *env) keyPair(dir, node string) tls.Certificate {
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key"))
	if err != nil {
		e.t.Fatal(err)
	}
	c.Leaf, err = x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// deliver runs fires for every source the tests write to until none has
// rows left: what the alarms do in a deployment.
func (e *env) deliver() {
	e.t.Helper()
	sources := []relaycore.Partition{takedowns.ControlSource}
	for n := range e.nodes {
		sources = append(sources, takedowns.HoldingsSource(n))
	}
	for range 20 {
		busy := false
		for _, s := range sources {
			r, err := e.relay.Fire(e.ctx, s)
			if err != nil {
				e.t.Fatalf("fire %s: %v", s, err)
			}
			if r.RowsDelivered > 0 || r.RowsInspected > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
	}
	e.t.Fatal("sources still delivering after 20 rounds")
}

// run is one owner pass.
func (e *env) run() takedowns.RunResult {
	e.t.Helper()
	r, err := e.o.Run(e.ctx)
	if err != nil {
		e.t.Fatalf("owner run: %v", err)
	}
	return r
}

var keySeq atomic.Int64

func digestOf(content string) string {
	return fmt.Sprintf("%064x", len(content))[:56] + strings.Repeat("ab", 4)
}

// report sends one report of node for content.
func (e *env) report(node, content, state string, observed time.Time) {
	e.t.Helper()
	e.nodes[node] = true
	_, err := e.o.Report(e.ctx, node, fmt.Sprintf("k/%d", keySeq.Add(1)), []takedowns.Report{{ContentID: content,
		SHA256: digestOf(content), Size: 100, State: state, ObservedMS: observed.UnixMilli()}})
	if err != nil {
		e.t.Fatalf("report %s %s: %v", node, content, err)
	}
}

// orders reads all of node's orders.
func (e *env) orders(node string) []takedowns.Order {
	e.t.Helper()
	out, _, err := e.o.Orders(e.ctx, node, "", 500)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// evict is the node's side: the receipt edged signs for an order.
func (e *env) evict(dir, node string, ord takedowns.Order, at time.Time) []byte {
	e.t.Helper()
	s, err := takedown.Sign(takedown.Receipt{Request: ord.Request, ContentID: ord.ContentID, SHA256: ord.SHA256,
		Node: node, EvictedAt: at.UTC()}, e.keyPair(dir, node))
	if err != nil {
		e.t.Fatal(err)
	}
	return s.MarshalLine()
}

func (e *env) status(id string) takedowns.Status {
	e.t.Helper()
	st, err := e.o.Status(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func pkitestNew(t testing.TB, nodes ...string) string { return pkitest.New(t, nodes...) }
