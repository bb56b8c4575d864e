// Package daemon wires the edge agent together (what edged runs): the
// bbolt database shared by the segment store and the relay ledger, the
// mutual-TLS listener and its receive path (handleRelayConn), the relay
// executor, the local RPC with Prometheus metrics, certificate reload and
// graceful stop.
//
// Start-up order: open and check the database (a damaged one is set aside
// and a new one created: dbrepair.go), the ledger and the store (whose
// scan removes what a crash left half-written, quarantines damaged files
// and rebuilds a lost index from the segment files); reconcile the ledger
// (relay.Executor.Reconcile); then accept inbound connections, start the
// workers and serve the RPC. Stop order: stop accepting, cancel receives
// in progress (a receive that has not committed leaves nothing behind and
// is not acknowledged), let outbound attempts in flight finish for a short
// grace, stop the RPC, close the database.
package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/relay"
	"github.com/relay-dev/relay/edge/relayapi"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// DBFile is the database file inside storage.dir.
const DBFile = "edged.db"

// Options are what the configuration file does not hold.
type Options struct {
	// Log receives every log line; default slog.Default().
	Log *slog.Logger
	// Version is reported by the status RPC.
	Version string
	// Now is the ledger clock; default time.Now.
	Now func() time.Time
	// RPC bounds request bodies (zero values take rpc's defaults).
	RPC rpc.ServerOptions
	// SyncDir fsyncs a directory; nil means segstore.SyncDir. New calls it
	// for the parent of storage.dir and of segments/ when it creates them,
	// and for storage.dir when it creates the database file (tests record
	// the calls).
	SyncDir func(dir string) error
	// MaxConnsPerPeer bounds the inbound connections one peer may hold
	// open at once; more are closed right after the handshake. Default
	// config.MaxWorkers: an edged sender holds at most relay.workers
	// connections to a peer, so only a misbehaving peer reaches it.
	MaxConnsPerPeer int
	// IdleTimeout, if set, replaces max(1 min, relay.ack_timeout) as the
	// relay connections' idle timeout (see idleTimeout): tests make a
	// stalled peer time out in milliseconds with it.
	IdleTimeout time.Duration
	// StartupGCPercent, when positive, is the garbage collector's target
	// (debug.SetGCPercent) from New until reconciliation is done; then the
	// previous setting is restored. Start-up reads the whole database
	// (checkDB, the store's index check or rebuild, reconciliation) and
	// nearly all it allocates is garbage at once: at the default 100 the
	// heap grew to twice a small live set and set the process's resident
	// peak. Process-wide, so edged's main sets it and tests that run
	// several daemons at once do not.
	StartupGCPercent int
	// WrapTemp wraps the writer of every segment's temp file
	// (segstore.Options.WrapTemp): tests make the real store's writes
	// fail, as a full disk would, with it. nil in production.
	WrapTemp func(id string, w io.Writer) io.Writer
}

// Daemon is one running edge agent.
type Daemon struct {
	cfg   *config.Config
	opt   Options
	log   *slog.Logger
	db    *bolt.DB
	led   *ledger.Ledger
	store *segstore.Store
	tr    *transport.Transport
	ex    *relay.Executor
	met   *metrics
	rpc   *rpc.Server
	// api is the relay API client (relay_api); nil when it is off.
	api *relayapi.Agent

	shed shedLog // connections the listener gave up before TLS finished

	gcPercent int  // the GC target before StartupGCPercent
	gcSet     bool // StartupGCPercent is in force

	dbRepair  dbRepair // what openDB did at start
	cleanStop bool     // the previous run stopped cleanly (CleanStopFile)
	// newStore: there was no database before this start, so no previous
	// run to have stopped cleanly or not (previousStop).
	newStore bool
	// refetchKick starts a round of asking peers for lost segments
	// (refetch.go).
	refetchKick chan struct{}

	relayLn *transport.Listener
	rpcLn   net.Listener
	started time.Time
	serving atomic.Bool
	closeDB sync.Once
}

// New opens the database, segment store and ledger and loads the
// certificates. It does not listen yet (Listen) nor serve (Serve). On
// error everything opened is closed again.
func New(cfg *config.Config, opt Options) (_ *Daemon, err error) {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.MaxConnsPerPeer <= 0 {
		opt.MaxConnsPerPeer = config.MaxWorkers
	}
	if opt.SyncDir == nil {
		opt.SyncDir = segstore.SyncDir
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, opt: opt, log: opt.Log.With("node", cfg.NodeID), refetchKick: make(chan struct{}, 1)}
	if opt.StartupGCPercent > 0 {
		d.gcPercent, d.gcSet = debug.SetGCPercent(opt.StartupGCPercent), true
		defer func() {
			if err != nil {
				d.startupDone()
			}
		}()
	}
	if err := segstore.CreateDir(cfg.Storage.Dir, 0o700, opt.SyncDir); err != nil {
		return nil, fmt.Errorf("storage dir: %w", err)
	}
	if d.cleanStop, err = takeCleanStop(cfg.Storage.Dir); err != nil {
		return nil, err
	}
	dbPath := filepath.Join(cfg.Storage.Dir, DBFile)
	if _, err := os.Lstat(dbPath); errors.Is(err, os.ErrNotExist) && !d.cleanStop {
		d.newStore = true
	}
	d.db, d.dbRepair, err = openDB(dbPath, opt.Now(), opt.SyncDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.db.Close()
		}
	}()
	if d.dbRepair.MovedAside != "" {
		d.log.Error("database damaged: set aside, rebuilding the index from the segment files and re-deriving the ledger",
			"moved_to", d.dbRepair.MovedAside, "damage", d.dbRepair.Damage)
	}
	if d.led, err = ledger.Open(d.db); err != nil {
		return nil, err
	}
	shareBytes, shareSegs := peerShare(cfg)
	d.store, err = segstore.Open(cfg.Storage.Dir, d.db, segstore.Options{
		QuotaBytes: int64(cfg.Storage.QuotaBytes), QuotaSegments: cfg.Storage.QuotaSegments,
		MaxSegmentBytes: int64(cfg.Storage.MaxSegmentBytes), Now: opt.Now, SyncDir: opt.SyncDir,
		VerifyOnOpen: verifyOnOpen(cfg.Storage.VerifyOnStart, d.cleanStop), MakeRoom: d.makeRoomFunc(), WrapTemp: opt.WrapTemp,
		FsyncEachFile: cfg.Storage.FsyncEachFile, PackMaxBytes: int64(cfg.Storage.PackMaxBytes),
		SourceReserveBytes: shareBytes, SourceReserveSegments: shareSegs,
		// Set before any read or commit can call them (the store is not
		// shared before New returns); d.met and d.ex exist by then.
		OnQuarantine: func(q segstore.Quarantined) { d.onQuarantine(q) },
		OnRefetched:  func(e segstore.Entry) { d.onRefetched(e) },
		// d.api is set before Run, the first commit after it.
		OnCommit:      func(e segstore.Entry) { d.stored(e) },
		ReceiveMemory: int64(cfg.Storage.ReceiveMemoryBytes),
	})
	if err != nil {
		return nil, err
	}
	if cfg.Storage.PackMaxBytes > 0 && !d.store.Packing() {
		d.log.Warn("storage.pack_max_bytes: the store's file system cannot punch holes; every segment is stored as a file of its own",
			"dir", cfg.Storage.Dir)
	}
	d.met = newMetrics(d)
	d.reportRepairs()
	d.tr, err = transport.New(transport.Config{
		NodeID: cfg.NodeID, CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key, CAFile: cfg.TLS.CA,
		AllowPeer:        cfg.Accepts, // known_peers and inbound-only accept_from
		WrapConn:         d.bandwidth().Wrap,
		HandshakeTimeout: cfg.Relay.DialTimeout,
		Wire: wire.Options{MaxSegmentSize: int64(cfg.Storage.MaxSegmentBytes), IdleTimeout: idleTimeout(cfg, opt.IdleTimeout),
			Version: cfg.Relay.MaxProtocolVersion, Window: cfg.Relay.Window, Hold: d.store.Hold},
		OnReloadError: func(err error) {
			d.met.reloadErrors.Inc()
			d.log.Error("certificate reload failed; keeping the previous certificate", "err", err)
		},
		// A certificate put in use after a failed reload must say so, or
		// the last line logged claims the old one is still in use.
		OnReload: func(leaf *x509.Certificate) {
			d.met.reloads.Inc()
			d.met.certNotAfter.Set(float64(leaf.NotAfter.Unix()))
			d.log.Info("certificate reloaded; now in use", "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
		},
		OnReject: func(remote net.Addr, err error) {
			d.met.rejected.Inc()
			if reason, ok := shedReason(err); ok {
				d.met.shed.WithLabelValues(reason).Inc()
				d.shed.note(d.log, remote, reason)
				return
			}
			// A HELLO that breaks the protocol comes after TLS: from an
			// authenticated node, so it counts like any protocol error.
			if reason, ok := wire.ProtocolViolation(err); ok {
				d.met.protocolErrors.WithLabelValues(reason).Inc()
			}
			d.log.Warn("inbound connection refused", "remote", addrString(remote), "err", err)
		},
	})
	if err != nil {
		return nil, tlsProblems(err)
	}
	d.met.certNotAfter.Set(float64(d.tr.Material().Cert.Leaf.NotAfter.Unix()))
	peers := map[string]string{}
	for _, p := range cfg.KnownPeers {
		peers[p.ID] = p.Address
	}
	d.ex, err = relay.New(relay.Config{
		Peers:        peers,
		Condition:    ledger.Condition(cfg.Relay.SuccessCondition),
		Policy:       policy(cfg),
		EvictOnRelay: cfg.Relay.EvictOnRelay,
		Workers:      cfg.Relay.Workers,
		AckTimeout:   cfg.Relay.AckTimeout,
		DialTimeout:  cfg.Relay.DialTimeout,
		PushMaxBytes: cfg.Relay.PushMaxBytes,
		Retention:    cfg.Relay.LedgerRetention,
		Now:          opt.Now,
		Log:          d.log,
		Observer:     d.met.observer(),
	}, d.led, d.store, d.tr)
	if err != nil {
		return nil, err
	}
	if d.api, err = d.relayAPI(); err != nil {
		return nil, err
	}
	d.rpc = rpc.NewServer(backend{d}, d.met.reg, d.log, opt.RPC)
	return d, nil
}

// relayAPI wires the relay API client (edge/relayapi) when relay_api.url
// is set: the node's certificate from the transport (renewals included),
// or SigV4 credentials from the default chain; the store and this
// daemon's Takedown.
func (d *Daemon) relayAPI() (*relayapi.Agent, error) {
	c := d.cfg.RelayAPI
	if !c.Enabled() {
		return nil, nil
	}
	hc, err := relayapi.NewHTTPClient(c, func() *tls.Certificate { return &d.tr.Material().Cert })
	if err != nil {
		return nil, err
	}
	var sign relayapi.Signer
	if c.Auth == config.AuthSigV4 {
		var source string
		if sign, source, err = relayapi.NewSigV4(c.Region); err != nil {
			return nil, err
		}
		d.log.Info("relay_api: SigV4 credentials", "from", source, "region", c.Region)
	}
	return relayapi.New(relayapi.Options{
		Node: d.cfg.NodeID, Config: c, HTTP: hc, Sign: sign, DB: d.db, Store: d.store,
		Evict: func(seg, request string) (bool, error) {
			t, err := d.Takedown(seg, request)
			return t.Evicted, err
		},
		Registerer: d.met.reg, Log: d.log, Now: d.opt.Now, UserAgent: "edged/" + d.opt.Version,
	})
}

// idleTimeout bounds each read and write on a relay connection, including
// a receiver's wait for the next OFFER and for each read of a SEGMENT. It
// is at least the ACK timeout, so a sender's wait for an ACK is governed
// by ack_timeout, and longer than the sender's connection-pool idle limit
// (30s), so a receiver does not close connections the sender is about to
// reuse. override (Options.IdleTimeout) replaces it when set.
func idleTimeout(cfg *config.Config, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return max(time.Minute, cfg.Relay.AckTimeout)
}

// peerShare is what one peer's unfinished segments may reserve at once
// (storage.peer_reserve_percent): that share of quota_bytes, but never
// less than max_segment_bytes (the largest segment must still fit), and
// of quota_segments, at least one.
func peerShare(cfg *config.Config) (bytes, segments int64) {
	s := cfg.Storage
	pct := int64(s.PeerReservePercent)
	return max(int64(s.QuotaBytes)*pct/100, int64(s.MaxSegmentBytes)), max(s.QuotaSegments*pct/100, 1)
}

func policy(cfg *config.Config) ledger.Policy {
	return ledger.Policy{MaxRetries: cfg.Relay.MaxRetries, Initial: cfg.Relay.Backoff.Initial, Max: cfg.Relay.Backoff.Max}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// Listen binds the relay listener (mutual TLS) and the RPC listener.
func (d *Daemon) Listen() error {
	ln, err := d.tr.Listen(d.cfg.Listen)
	if err != nil {
		return err
	}
	rln, err := rpc.Listen(d.cfg.RPC.Listen)
	if err != nil {
		ln.Close()
		return err
	}
	d.relayLn, d.rpcLn = ln, rln
	return nil
}

// ListenOn is Listen with listeners the caller bound (the Daemon owns
// them from now on): for tests and socket activation. The RPC listener
// must be loopback or a unix socket; that is the caller's duty here.
func (d *Daemon) ListenOn(relayLn, rpcLn net.Listener) {
	d.relayLn, d.rpcLn = d.tr.Serve(relayLn), rpcLn
}

// RelayAddr and RPCAddr are the bound addresses (after Listen).
func (d *Daemon) RelayAddr() net.Addr { return d.relayLn.Addr() }

// RPCAddr: see RelayAddr.
func (d *Daemon) RPCAddr() net.Addr { return d.rpcLn.Addr() }

// Reload re-reads the certificate files now (SIGHUP). On error the
// previous certificate stays in use.
func (d *Daemon) Reload() error {
	err := d.tr.Reload()
	if err != nil {
		d.met.reloadErrors.Inc()
		d.log.Error("certificate reload failed; keeping the previous certificate", "err", err)
		return err
	}
	d.log.Info("certificates reloaded")
	return nil
}

// Run is Listen followed by Serve.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.Listen(); err != nil {
		d.Close()
		return err
	}
	return d.Serve(ctx)
}

// Serve reconciles the ledger and serves until ctx is canceled, then
// stops gracefully and closes the database. Listen must have succeeded.
func (d *Daemon) Serve(ctx context.Context) error {
	defer d.Close()
	rep, err := d.ex.Reconcile()
	d.startupDone()
	if err != nil {
		d.relayLn.Close()
		d.rpcLn.Close()
		return err
	}
	d.log.Info("ledger reconciled", "abandoned_inflight", rep.AbandonedInflight, "pruned_missing", rep.PrunedMissing,
		"undeferred", rep.Undeferred, "rescheduled", rep.Rescheduled, "scheduled", rep.Scheduled, "segments", rep.Segments, "retention_removed", rep.Removed, "unrelayed", rep.Unrelayed)
	d.started = time.Now()

	// runCtx ends on ctx or when the RPC server fails; either way
	// everything stops.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	rpcErr := make(chan error, 1)
	exErr := make(chan error, 1)
	wg.Add(5)
	go func() {
		defer wg.Done()
		d.acceptLoop(runCtx)
	}()
	if d.api != nil {
		wg.Go(func() { d.api.Run(runCtx) })
	}
	go func() {
		defer wg.Done()
		d.refetchLoop(runCtx)
	}()
	go func() {
		defer wg.Done()
		d.scrubLoop(runCtx)
	}()
	go func() {
		defer wg.Done()
		exErr <- d.ex.Run(runCtx)
	}()
	go func() {
		defer wg.Done()
		rpcErr <- d.rpc.Serve(d.rpcLn)
	}()
	d.serving.Store(true)
	d.log.Info("edged serving", "listen", d.relayLn.Addr().String(), "rpc", d.rpcLn.Addr().String(),
		"peers", d.ex.PeerIDs(), "accept_from", d.cfg.AcceptFrom, "condition", d.cfg.Relay.SuccessCondition, "evict_on_relay", d.cfg.Relay.EvictOnRelay,
		"relay_api", d.cfg.RelayAPI.URL)

	var first error
	select {
	case <-runCtx.Done():
	case first = <-rpcErr:
		d.log.Error("rpc server failed", "err", first)
	}
	d.serving.Store(false)
	d.log.Info("edged stopping")
	stop()
	d.relayLn.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	d.rpc.Shutdown(sctx)
	cancel()
	wg.Wait()
	if err := <-exErr; first == nil {
		first = err
	}
	d.log.Info("edged stopped")
	return first
}

// startupDone restores the GC target StartupGCPercent replaced.
func (d *Daemon) startupDone() {
	if d.gcSet {
		debug.SetGCPercent(d.gcPercent)
		d.gcSet = false
	}
}

// Close closes the database (Serve does it when it returns) and then
// marks the stop clean (CleanStopFile). Safe to call more than once.
func (d *Daemon) Close() error {
	d.startupDone() // when Serve never ran
	var err error
	d.closeDB.Do(func() {
		if err = d.db.Close(); err == nil {
			if merr := markCleanStop(d.cfg.Storage.Dir); merr != nil {
				d.log.Warn("could not mark the stop clean; the next start verifies every segment", "err", merr)
			}
		}
	})
	return err
}
