package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/relayapi"
	"github.com/relay-dev/relay/edge/transport"
)

// Main is edged's command line:
//
//	edged -config FILE                 run until SIGINT/SIGTERM
//	edged -check-config -config FILE   validate the config and TLS files, print the effective settings
//
// A value on reload (SIGHUP, forwarded by main) re-reads the certificate
// files. It returns the process exit code: 0, 1 (failure at run time) or
// 2 (bad command line or configuration).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, reload <-chan os.Signal, version string) int {
	fs := flag.NewFlagSet("edged", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "/etc/edged/edged.yaml", "configuration file (YAML; see docs/edge-config.md)")
	check := fs.Bool("check-config", false, "validate the configuration and certificate files, print the effective settings and exit")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "edged: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "edged", version)
		return 0
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "edged: -log-level: %v\n", err)
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "edged: %v\n", err)
		return 2
	}
	// The certificate files are part of the configuration to an operator:
	// check them before anything else, naming their keys.
	if _, err := transport.NewReloader(cfg.NodeID, cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA, nil); err != nil {
		fmt.Fprintf(stderr, "edged: %s: %v\n", *cfgPath, tlsProblems(err))
		return 2
	}
	// A storage.dir that is a file would fail the start with an error
	// that names no key.
	if fi, err := os.Stat(cfg.Storage.Dir); err == nil && !fi.IsDir() {
		fmt.Fprintf(stderr, "edged: %s: %v\n", *cfgPath, config.Problems{{Key: "storage.dir", Message: fmt.Sprintf("%s is a file, want a directory (it is created when missing)", cfg.Storage.Dir)}})
		return 2
	}
	if cfg.RelayAPI.Enabled() {
		if _, err := relayapi.NewHTTPClient(cfg.RelayAPI, nil); err != nil {
			fmt.Fprintf(stderr, "edged: %s: %v\n", *cfgPath, err)
			return 2
		}
	}
	if *check {
		return checkConfig(cfg, *cfgPath, stdout)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	d, err := New(cfg, Options{Log: log, Version: version, StartupGCPercent: startupGCPercent})
	if err != nil {
		log.Error("start failed", "err", err)
		return 1
	}
	go func() {
		for {
			select {
			case <-reload:
				d.Reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := d.Run(ctx); err != nil {
		log.Error("edged failed", "err", err)
		return 1
	}
	return 0
}

// tlsProblems turns certificate file errors into configuration problems
// keyed tls.cert, tls.key and tls.ca (every file that failed), so the
// first start of a new node says which setting names the missing or bad
// file. Other errors pass unchanged.
func tlsProblems(err error) error {
	fes := transport.FileErrors(err)
	if len(fes) == 0 {
		return err
	}
	var ps config.Problems
	for _, fe := range fes {
		ps = append(ps, config.Problem{Key: "tls." + fe.Role, Message: fe.Err.Error()})
	}
	return ps
}

// checkConfig prints the effective settings of a configuration whose
// file and certificate files Main has checked.
func checkConfig(cfg *config.Config, path string, stdout io.Writer) int {
	fmt.Fprintf(stdout, "%s: OK\n", path)
	fmt.Fprintf(stdout, "node_id: %s\nlisten: %s\nrpc.listen: %s\n", cfg.NodeID, cfg.Listen, cfg.RPC.Listen)
	fmt.Fprintf(stdout, "tls: cert=%s key=%s ca=%s\n", cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA)
	for _, p := range cfg.KnownPeers {
		if p.Bandwidth > 0 {
			fmt.Fprintf(stdout, "known_peer: %s at %s (bandwidth %s)\n", p.ID, p.Address, p.Bandwidth)
			continue
		}
		fmt.Fprintf(stdout, "known_peer: %s at %s\n", p.ID, p.Address)
	}
	for _, id := range cfg.AcceptFrom {
		fmt.Fprintf(stdout, "accept_from: %s (inbound only)\n", id)
	}
	r := cfg.Relay
	fmt.Fprintf(stdout, "relay: success_condition=%s max_retries=%d backoff=%s..%s evict_on_relay=%t workers=%d ack_timeout=%s dial_timeout=%s\n",
		r.SuccessCondition, r.MaxRetries, r.Backoff.Initial, r.Backoff.Max, r.EvictOnRelay, r.Workers, r.AckTimeout, r.DialTimeout)
	fmt.Fprintf(stdout, "relay: window=%d max_protocol_version=%d push_max_bytes=%d ledger_retention=%s\n",
		r.Window, r.MaxProtocolVersion, r.PushMaxBytes, r.LedgerRetention)
	fmt.Fprintf(stdout, "relay.bandwidth: total=%s per_peer=%s\n", r.Bandwidth.Total, r.Bandwidth.PerPeer)
	s := cfg.Storage
	fmt.Fprintf(stdout, "storage: dir=%s quota_bytes=%s quota_segments=%d max_segment_bytes=%s on_full=%s verify_on_start=%s\n",
		s.Dir, s.QuotaBytes, s.QuotaSegments, s.MaxSegmentBytes, s.OnFull, s.VerifyOnStart)
	fmt.Fprintf(stdout, "storage: fsync_each_file=%t pack_max_bytes=%s scrub_interval=%s scrub_rate=%s receive_memory_bytes=%s\n",
		s.FsyncEachFile, s.PackMaxBytes, s.ScrubInterval, s.ScrubRate, s.ReceiveMemoryBytes)
	for _, d := range cfg.RPC.IngestDirs {
		fmt.Fprintf(stdout, "rpc.ingest_dir: %s\n", d)
	}
	shareBytes, shareSegs := peerShare(cfg)
	fmt.Fprintf(stdout, "inbound: idle_timeout=%s min_rate=%s handshake_timeout=%s peer_reserve=%s or %d segments (%d%%)\n",
		idleTimeout(cfg, 0), r.InboundMinRate, r.DialTimeout, config.ByteSize(shareBytes), shareSegs, s.PeerReservePercent)
	if a := cfg.RelayAPI; a.Enabled() {
		ca := a.CA
		if ca == "" {
			ca = "system roots"
		}
		fmt.Fprintf(stdout, "relay_api: url=%s auth=%s ca=%s region=%s report_interval=%s report_delay=%s order_interval=%s batch=%d timeout=%s backoff=%s..%s\n",
			a.URL, a.Auth, ca, a.Region, a.ReportInterval, a.ReportDelay, a.OrderInterval, a.Batch, a.Timeout, a.Backoff.Initial, a.Backoff.Max)
	} else {
		fmt.Fprintln(stdout, "relay_api: off")
	}
	return 0
}

// startupGCPercent is edged's Options.StartupGCPercent: with 10,000
// segments stored, the start-ups that owe them all to a peer anew peaked
// at 34-36 MiB resident with the default 100 and 27-31 MiB with 25 (see
// docs/benchmarks.md, "Device footprint"); the extra collections cost
// little on a live set of a few MB.
const startupGCPercent = 25
