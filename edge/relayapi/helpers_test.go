package relayapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/takedown"
)

// fixture is one node: a real bbolt file, a real segment store, a real
// node certificate, talking over real TLS to the contract server.
type fixture struct {
	t      *testing.T
	node   string
	pkiDir string
	dir    string
	srv    *relayapitest.Server
	db     *bolt.DB
	store  *segstore.Store
	cert   tls.Certificate
	pool   *x509.CertPool
	cfg    config.RelayAPI
	agent  *Agent
	reg    *prometheus.Registry
}

// newFixture makes a CA, the node's certificate and the server; mod
// adjusts the relay_api settings.
func newFixture(t *testing.T, node string, mod func(*config.RelayAPI)) *fixture {
	t.Helper()
	f := &fixture{t: t, node: node, pkiDir: t.TempDir(), dir: t.TempDir()}
	if _, err := pki.InitCA(f.pkiDir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	f.srv = relayapitest.New(t, relayapitest.Options{PKIDir: f.pkiDir})
	f.cfg = config.Default().RelayAPI
	f.cfg.URL, f.cfg.CA = f.srv.URL(), f.srv.CAFile()
	f.cfg.Backoff = config.Backoff{Initial: time.Millisecond, Max: 4 * time.Millisecond}
	f.cfg.ReportInterval, f.cfg.OrderInterval = 5*time.Millisecond, 5*time.Millisecond
	f.cfg.Timeout = 10 * time.Second
	if mod != nil {
		mod(&f.cfg)
	}
	f.cert = issue(t, f.pkiDir, node)
	pem, err := os.ReadFile(filepath.Join(f.pkiDir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	f.pool = x509.NewCertPool()
	f.pool.AppendCertsFromPEM(pem)
	f.open()
	return f
}

func issue(t *testing.T, dir, node string) tls.Certificate {
	t.Helper()
	p, err := pki.Issue(dir, node, pki.Options{Usage: pki.UsageNode, Overwrite: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// open opens edged.db, the store and a new agent: a start of the node.
func (f *fixture) open() {
	t := f.t
	t.Helper()
	db, err := bolt.Open(filepath.Join(f.dir, "edged.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.db = db
	t.Cleanup(func() { db.Close() })
	f.store, err = segstore.Open(f.dir, db, segstore.Options{QuotaBytes: 1 << 30, QuotaSegments: 10000, MaxSegmentBytes: 1 << 20,
		// As edged wires it (the agent is made below, before any commit).
		OnCommit: func(e segstore.Entry) { f.agent.Stored(e.ID) }})
	if err != nil {
		t.Fatal(err)
	}
	hc, err := NewHTTPClient(f.cfg, func() *tls.Certificate { return &f.cert })
	if err != nil {
		t.Fatal(err)
	}
	f.reg = prometheus.NewRegistry()
	f.agent, err = New(Options{Node: f.node, Config: f.cfg, HTTP: hc, DB: db, Store: f.store, Evict: f.evict,
		Registerer: f.reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
}

// restart closes the database and opens everything again, as a kill and
// a start would (bbolt commits are durable: nothing else is kept).
func (f *fixture) restart() {
	f.t.Helper()
	if err := f.db.Close(); err != nil {
		f.t.Fatal(err)
	}
	f.open()
}

// evict is the daemon's Takedown without the ledger: the store's one
// transaction with a receipt signed by the node's key.
func (f *fixture) evict(seg, request string) (bool, error) {
	res, err := f.store.Takedown(seg, request, func(_ *bolt.Tx, tb segstore.Tombstone, req string) ([]byte, error) {
		s, err := takedown.Sign(takedown.Receipt{Request: req, ContentID: tb.ID, SHA256: tb.SHA256, Node: f.node, EvictedAt: tb.EvictedAt}, f.cert)
		if err != nil {
			return nil, err
		}
		return s.MarshalLine(), nil
	})
	return res.Evicted, err
}

// put stores a segment and returns its digest.
func (f *fixture) put(id string, content []byte) string {
	f.t.Helper()
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])
	if _, err := f.store.Write(id, int64(len(content)), sha, bytes.NewReader(content), ""); err != nil {
		f.t.Fatal(err)
	}
	return sha
}

// walkPass is a holdings pass that walks the whole index (the interval's).
func (f *fixture) walkPass(ctx context.Context) error { return f.agent.reportPass(ctx, false) }

// pass runs one pass of a job and fails the test on an error.
func (f *fixture) pass(p func(context.Context) error) {
	f.t.Helper()
	if err := p(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) held() map[string]string {
	out := map[string]string{}
	for id, r := range f.srv.Holdings(f.node) {
		if r.State == takedown.StateHeld {
			out[id] = r.SHA256
		}
	}
	return out
}

// run runs the agent until the test ends.
func (f *fixture) run() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.agent.Run(ctx) })
	f.t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}
