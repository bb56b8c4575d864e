package relayserve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Table names in the bbolt files, the same as `relay demo`, `relay
// status` and the operator commands use, so they all work on a server's
// file (when it is stopped: bbolt allows one process at a time). They are
// also the store names in PostgreSQL's relay_items.
const (
	SourceTable = "source"
	TargetTable = "target"
)

// Options are what Run takes besides the configuration.
type Options struct {
	// Logger receives the server's JSON logs; nil discards.
	Logger *slog.Logger
	// ReadyFile, when set, is written (atomically) once the server
	// accepts connections: a JSON object {"addr","url","pid"}. Tests and
	// supervisors read the bound address from it (listen port 0). It is
	// removed at start and when Run returns.
	ReadyFile string

	// Reload, when it delivers, reloads the configuration's reloadable
	// keys (principals, auth) from ConfigPath and the credential files:
	// the tokens file, the client CA and the server certificate (`relay
	// serve` sends on SIGHUP). It is all or nothing: a reload that fails
	// keeps the configuration and the credentials in use and logs why.
	Reload <-chan struct{}
	// ConfigPath is the file cfg was loaded from (LoadAndCheck). A
	// reload re-reads and checks it as the start did; if it changed a
	// key other than principals and auth (listen, db, tls, limits, ...)
	// the reload is refused, naming every such key, because those are
	// read only at start. Empty (a Config an embedder built in memory):
	// a reload re-reads the credential files only.
	ConfigPath string

	// wrapTarget, when set, wraps the target store (tests inject faults
	// and hold fires in flight with it).
	wrapTarget func(relaycore.Store) relaycore.Store
}

// ReadyInfo is the content of Options.ReadyFile.
type ReadyInfo struct {
	Addr string `json:"addr"`
	URL  string `json:"url"`
	PID  int    `json:"pid"`
}

// Check loads everything the configuration names (TLS files, tokens
// file, client CA) without opening the store or listening, and returns
// every problem found: what `relay serve --check-config` runs after Load
// (and then CheckStore, which connects to a database store).
func Check(cfg Config) error {
	_, err := loadCredentials(cfg)
	for _, f := range []struct{ key, path string }{{"db", cfg.DB}, {"targets.db", cfg.Targets.DB}} {
		if f.path != "" {
			err = errors.Join(err, checkStorePath(f.key, f.path))
		}
	}
	return err
}

// checkStorePath reports what would stop bbolt opening path, without
// creating the file: bbolt creates a missing file but not its directory.
func checkStorePath(key, path string) error {
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s %s: not a regular file", key, path)
		}
		return nil
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%s %s: its directory: %w (create it, owned by the server's user)", key, path, err)
	case !st.IsDir():
		return fmt.Errorf("%s %s: %s is not a directory", key, path, dir)
	}
	return nil
}

// Run serves until ctx is cancelled, then drains: it stops accepting,
// lets in-flight requests and fires finish (or, past drain_timeout,
// cancels them: a fire's claim then lapses and its durable alarm fires
// after the next start, so nothing is lost), and closes the store. It
// returns nil after a complete drain.
func Run(ctx context.Context, cfg Config, opt Options) error {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opt.ReadyFile != "" {
		if err := os.Remove(opt.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("ready file: %w", err)
		}
		defer os.Remove(opt.ReadyFile)
	}
	creds, err := loadCredentials(cfg)
	if err != nil {
		return err
	}
	tc := creds.tlsConfig()
	budget, err := cfg.RelayBudget()
	if err != nil {
		return err
	}

	st, err := openConfiguredStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.close(); err != nil {
			log.Error("relay serve: close store", "err", err)
		}
	}()
	src, dst := st.source, st.target
	if opt.wrapTarget != nil {
		dst = opt.wrapTarget(dst)
	}

	// Fires run on their own context: at shutdown the clock stops
	// starting alarms at once, but running ones finish unless the drain
	// deadline passes (then this context is cancelled).
	fireCtx, cancelFires := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFires()
	var firesRunning atomic.Int64
	m := newMetrics(src)
	// A fire's targets are delivered together, so their batches share the
	// file's group commit (infra/bolt): one fsync, not one per target.
	relay := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget, Logger: log, ClaimTTL: cfg.Alarms.ClaimTTL,
		DeliverConcurrency: 8, Hook: takedowns.Hook{Delay: cfg.Takedowns.Overdue}, IdleTargetTTL: cfg.Alarms.idleTargetTTL()}
	roots, err := takedownRoots(cfg)
	if err != nil {
		return err
	}
	owner := &takedowns.Owner{Relay: relay, Roots: roots, Logger: log, CloseAfter: cfg.Takedowns.CloseAfter}
	ownerKick := make(chan struct{}, 1)
	replica := cfg.Alarms.Replica
	if replica == "" {
		host, _ := os.Hostname()
		replica = fmt.Sprintf("%s-%d", cmp.Or(host, "relay"), os.Getpid())
	}
	// Source: replicas on one database all sweep it; the clock checks an
	// alarm it was not kicked for before firing it (infra/alarmclock).
	clock := alarmclock.New(alarmclock.Config{
		Handler: detachedAlarmer{relay, fireCtx, &firesRunning}, Index: st.index, Source: src, Replica: replica,
		Workers: cfg.Alarms.Workers, SweepInterval: cfg.Alarms.SweepInterval, Linger: cfg.Alarms.Linger, Logger: log,
		Observe: func(s relaycore.Partition, r relaycore.AlarmResult, err error) {
			m.alarm(fireCtx, s, r, err)
			if takedowns.Reserved(string(s)) {
				// What it delivered may be the owner's next step.
				select {
				case ownerKick <- struct{}{}:
				default:
				}
			}
		},
		ObserveSweep: m.sweep,
	})
	relay.Kicker = clock
	m.clock.stats, m.clock.replica = clock.Stats, replica
	h := &api.Handler{
		Source: src, Relay: relay, Routes: api.RoutesAll, Logger: log, MaxBodyBytes: cfg.Limits.MaxBodyBytes,
		Takedowns: owner, Committed: func(src relaycore.Partition, _ relaycore.CommitResult) { m.committed(src, time.Now().UnixMilli()) },
	}

	var clockRunning, draining atomic.Bool
	ready := func(ctx context.Context) error {
		switch {
		case draining.Load():
			return errors.New("draining: shutting down")
		case !clockRunning.Load():
			return errors.New("alarm clock not running")
		}
		return st.health(ctx)
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ta, ok := ln.Addr().(*net.TCPAddr)
	loopback := ok && ta.IP.IsLoopback()
	if (cfg.Auth.Anonymous != nil || tc == nil) && !loopback {
		// The configuration check read the name; this is what it bound
		// (a "localhost" that resolves elsewhere).
		ln.Close()
		return fmt.Errorf("listen %s bound %s, not a loopback address: anonymous access and plain HTTP are loopback only", cfg.Listen, ln.Addr())
	}
	lim := newLimitListener(ln, cfg.Limits.MaxConnections, m.idleClosed.Inc)
	// Requests run on a context a drain does not cancel (in-flight
	// requests finish); past the drain deadline it is cancelled, so store
	// calls stop before the file closes.
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	l := cfg.Limits
	hh := newHTTPHandler(h, creds, l.MaxBodyBytes, m, log, ready)
	hh.readTimeout = l.ReadTimeout
	hh.answerWithin = answerWithin(l.WriteTimeout, st.lingerAfterCancel)
	hh.slots = make(chan struct{}, l.MaxConnections)
	hh.authenticated = func(r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
			lim.authenticated(c)
		}
	}
	hh.backup = st.backup
	srv := &http.Server{
		Handler:           hh,
		TLSConfig:         tc,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: lim.trackState,
		// An HTTP/2 connection carries up to this many requests at once;
		// all connections together carry at most max_connections
		// (hh.slots), so HTTP/2 cannot multiply what HTTP/1.1 allows.
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: min(maxStreamsPerConn, l.MaxConnections)},
		ErrorLog: newServerErrorLog(log, m.handshakeErrors.Inc, time.Now),
	}

	clockCtx, stopClock := context.WithCancel(context.WithoutCancel(ctx))
	defer stopClock()
	clockDone := make(chan struct{})
	clockRunning.Store(true)
	go func() {
		defer close(clockDone)
		clock.Run(clockCtx)
		clockRunning.Store(false)
	}()
	ownerDone := make(chan struct{})
	go func() {
		defer close(ownerDone)
		runOwner(clockCtx, owner, cfg.Alarms.SweepInterval, ownerKick, newTakedownMetrics(m.reg), log)
	}()
	// Gauges of sources alarmed elsewhere, or acted on through the API,
	// are re-read from the store once a sweep period (metrics.refresh).
	gaugesDone := make(chan struct{})
	go func() {
		defer close(gaugesDone)
		m.refreshLoop(clockCtx, cfg.Alarms.SweepInterval)
	}()
	// The owner and the gauges' refresh stop with the clock, and before
	// the store closes (the deferred close runs after this).
	defer func() { stopClock(); <-ownerDone; <-gaugesDone }()
	serveErr := make(chan error, 1)
	go func() {
		if tc != nil {
			serveErr <- srv.ServeTLS(lim, "", "")
		} else {
			serveErr <- srv.Serve(lim)
		}
	}()

	addr := ln.Addr().String()
	scheme := "http"
	if tc != nil {
		scheme = "https"
	}
	info := ReadyInfo{Addr: addr, URL: scheme + "://" + addr, PID: os.Getpid()}
	if opt.ReadyFile != "" {
		if err := writeReadyFile(opt.ReadyFile, info); err != nil {
			log.Error("relay serve: ready file", "err", err)
		}
	}
	attrs := append([]any{"addr", addr, "url", info.URL}, st.logAttrs...)
	log.Info("relay serve: listening", append(attrs, "replica", replica,
		"budget", cfg.Budget.Plan, "tls", tc != nil, "client_certs", cfg.TLS.ClientCA != "",
		"tokens", cfg.Auth.TokensFile != "", "anonymous", cfg.Auth.Anonymous != nil)...)

	rl := &reloader{path: opt.ConfigPath, inUse: cfg, loopback: loopback, creds: creds}
	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-serveErr:
			runErr = fmt.Errorf("serve: %w", err)
			break wait
		case <-opt.Reload:
			changed, err := rl.reload()
			if err != nil {
				attrs := []any{"config", opt.ConfigPath, "err", err}
				if re, ok := errors.AsType[*restartError](err); ok {
					attrs = append(attrs, "restart_keys", re.Keys)
				}
				log.Error("relay serve: reload failed; the configuration and credentials in use stay", attrs...)
			} else {
				c := rl.inUse
				log.Info("relay serve: reloaded", "config", opt.ConfigPath, "changed", changed,
					"tokens_file", c.Auth.TokensFile, "client_ca", c.TLS.ClientCA, "cert", c.TLS.Cert,
					"principals", len(c.Principals), "anonymous", c.Auth.Anonymous != nil)
			}
		}
	}
	draining.Store(true)
	log.Info("relay serve: draining", "timeout", cfg.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	start := time.Now()

	// Requests first: an enqueue still running may kick the clock. Those
	// still receiving their bodies get half the drain (bodyReads).
	hh.reads.drain(start.Add(cfg.DrainTimeout / 2))
	forced := false
	if err := srv.Shutdown(dctx); err != nil {
		forced = true
		log.Warn("relay serve: requests still running at the drain deadline; cancelling them", "err", err)
		cancelRequests()
		srv.Close()
	}
	stopClock()
	select {
	case <-clockDone:
	case <-dctx.Done():
		// The deadline may have passed in the request drain, with no
		// fire running: then the clock is only returning, and neither
		// a warning nor "forced" would be true. Cancelling is harmless
		// either way (an alarm the stopping clock still hands out must
		// not run past the deadline).
		if n := firesRunning.Load(); n > 0 {
			forced = true
			log.Warn("relay serve: fires still running at the drain deadline; cancelling them (their claims lapse, their alarms fire after restart)", "fires", n)
		}
		cancelFires()
		<-clockDone
	}
	log.Info("relay serve: stopped", "drain_ms", time.Since(start).Milliseconds(), "forced", forced)
	if runErr == nil && forced {
		runErr = errors.New("drain timed out: in-flight work was cancelled (nothing acknowledged is lost)")
	}
	return runErr
}

// maxStreamsPerConn bounds the streams (requests at once) of one HTTP/2
// connection: the default would be 250.
const maxStreamsPerConn = 32

// connKey is the request context's key of the connection it came on.
type connKey struct{}

// detachedAlarmer runs alarms on its own context rather than the clock's,
// so stopping the clock lets running fires finish; it counts them for
// the drain's report.
type detachedAlarmer struct {
	h       *relaycore.RelayHandler
	ctx     context.Context
	running *atomic.Int64
}

func (d detachedAlarmer) Alarm(_ context.Context, source relaycore.Partition) (relaycore.AlarmResult, error) {
	d.running.Add(1)
	defer d.running.Add(-1)
	return d.h.Alarm(d.ctx, source)
}

func writeReadyFile(path string, info ReadyInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ready-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// answerWithin is how long an API request's work may take
// (httpHandler.answerWithin): limits.write_timeout less a margin to answer
// 503 and write it (event.AnswerMargin, the Lambda functions' rule: a
// quarter of it, at most 3 s) and less the time a
// store call may run on after its context ended (linger: PostgreSQL's
// cancel request), but at least a quarter of write_timeout.
func answerWithin(writeTimeout, linger time.Duration) time.Duration {
	return max(writeTimeout/4, writeTimeout-event.AnswerMargin(writeTimeout)-linger)
}
