// Package relaycli implements the relay command: its subcommands, flags and
// output. The main package only wires signals and the exit code.
package relaycli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/internal/buildversion"
	"github.com/relay-dev/relay/internal/demo"
	"github.com/relay-dev/relay/relaycore"
)

// Run executes the relay command with args and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return RunWithInput(ctx, args, nil, stdout, stderr)
}

// RunWithInput is Run with stdin supplied (nil = os.Stdin).
func RunWithInput(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	if strings.HasPrefix(err.Error(), "unknown command ") {
		err = &usageError{err}
	}
	fmt.Fprintln(stderr, "relay:", err)
	if _, done := errors.AsType[*reportedError](err); !done && wantsJSON(cmd, args) {
		printError(stdout, err)
	}
	return 1
}

// newRoot builds the relay command and its subcommands.
func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "relay",
		Short:         "Relay: reliable outbox delivery from sources to targets",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return &usageError{singleDashHint(cmd, err)} })
	root.AddCommand(demoCmd(stdout, stderr), statusCmd(stdout), enqueueCmd(stdinOr(stdin), stdout), fireCmd(stdout))
	root.AddCommand(targetsCmd(stdout), targetCmd(stdout), archiveCmd(stdout), serveCmd(stdout, stderr), backupCmd(stdout), takedownCmd(stdout))
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print relay's version: module version, commit, Go version and platform",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, "relay", buildversion.String())
			return err
		},
	})
	wrapUsage(root)
	return root
}

func demoCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := demo.Defaults
	var (
		asJSON   bool
		store    string
		dbPath   string
		logLevel string
		dyn      dynamoOptions
	)
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run the embedded relay on a realistic workload to quiescence and verify the result",
		Long: `demo starts an embedded relay with an in-process alarm clock, runs several
sources with concurrent writers appending rows for dozens of targets, lets one
target fail for a while, waits until every outbox is drained, checks every target
key against a model of what was written, and prints a summary (also when a check
fails: then it exits 1 after the summary).

The store is chosen by --store:
  bolt    a bbolt file (--db, default a temporary file removed afterwards)
  dynamo  two DynamoDB tables, <table-prefix>source and <table-prefix>target,
          created when missing; tables that already hold items are refused
          unless --reuse-tables. Without --endpoint an in-process DynamoDB-API
          endpoint serves them; --endpoint aws uses your AWS credentials.
          --inject-throttle and --inject-drop make a share of the requests
          fail as DynamoDB's throttling and lost responses do.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return &usageError{fmt.Errorf("--log-level: %w", err)}
			}
			logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
			if store != "dynamo" {
				for _, name := range []string{"endpoint", "table-prefix", "reuse-tables", "inject-throttle", "inject-drop"} {
					if cmd.Flags().Changed(name) {
						return usageErrorf("--%s needs --store dynamo", name)
					}
				}
			}
			if store == "dynamo" && cmd.Flags().Changed("db") {
				return usageErrorf("--db is a bbolt file: it needs --store bolt")
			}
			if _, err := relaycore.PlanBudget(cfg.Plan); err != nil {
				return usageErrorf("--plan %q: want free or paid", cfg.Plan)
			}
			dyn.seed = cfg.Seed
			stores, closeStores, err := openStores(cmd.Context(), store, dbPath, dyn)
			if err != nil {
				return err
			}
			defer closeStores()
			progress := stdout
			if asJSON {
				progress = stderr
			}
			fmt.Fprintf(progress, "relay demo: store %s, plan %s, %d sources x %d writers, %d targets, %d rows per source, seed %d\n",
				stores.Name, cfg.Plan, cfg.Sources, cfg.WritersPerSrc, cfg.Targets, cfg.RowsPerSource, cfg.Seed)
			// The summary prints whatever happened: what was delivered is
			// worth seeing most when a check failed.
			sum, err := demo.Run(cmd.Context(), cfg, stores, progress, logger)
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(sum); jerr != nil && err == nil {
					return jerr
				}
				if err != nil {
					// The summary's "error" says what failed.
					return &reportedError{err}
				}
				return nil
			}
			printSummary(stdout, sum)
			return err
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Plan, "plan", cfg.Plan, "budget plan: free or paid")
	f.IntVar(&cfg.Sources, "sources", cfg.Sources, "number of sources")
	f.IntVar(&cfg.Targets, "targets", cfg.Targets, "number of targets")
	f.IntVar(&cfg.RowsPerSource, "rows", cfg.RowsPerSource, "rows enqueued per source")
	f.IntVar(&cfg.BatchRows, "batch", cfg.BatchRows, "rows per enqueue call")
	f.IntVar(&cfg.WritersPerSrc, "writers", cfg.WritersPerSrc, "concurrent writers per source")
	f.IntVar(&cfg.ValueBytes, "value-bytes", cfg.ValueBytes, "bytes per row value")
	f.BoolVar(&cfg.FailingTarget, "failing-target", cfg.FailingTarget, "let one target fail its first applies, then recover")
	f.IntVar(&cfg.FailAttempts, "fail-attempts", cfg.FailAttempts, "apply attempts the failing target refuses")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "workload seed")
	f.DurationVar(&cfg.WriteInterval, "write-interval", cfg.WriteInterval, "pause between a writer's enqueue calls")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON (progress goes to stderr)")
	f.StringVar(&store, "store", "bolt", "store backend: bolt or dynamo")
	f.StringVar(&dyn.endpoint, "endpoint", "", `DynamoDB endpoint URL for --store dynamo ("aws" = the SDK default; empty = an in-process DynamoDB-API endpoint)`)
	f.StringVar(&dyn.tablePrefix, "table-prefix", "relay-demo-", "DynamoDB table name prefix for --store dynamo")
	f.BoolVar(&dyn.reuse, "reuse-tables", false, "with --store dynamo, run on tables that already hold items")
	f.Float64Var(&dyn.throttle, "inject-throttle", 0, "with --store dynamo, the share of requests (0..1) answered with a ThrottlingException")
	f.Float64Var(&dyn.drop, "inject-drop", 0, "with --store dynamo, the share of requests (0..1) whose response is lost after the endpoint ran them")
	f.StringVar(&dbPath, "db", "", "bbolt file (default: a new file in a temporary directory, removed afterwards)")
	f.StringVar(&logLevel, "log-level", "error", "log level: debug, info, warn, error")
	return c
}

func statusCmd(stdout io.Writer) *cobra.Command {
	var dbPath string
	c := &cobra.Command{
		Use:   "status SOURCE...",
		Short: "Show a source's outbox: os, scan cycle, undelivered rows, watermark",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needExistingDB(dbPath); err != nil {
				return err
			}
			stores, closeStores, err := openStores(cmd.Context(), "bolt", dbPath, dynamoOptions{})
			if err != nil {
				return err
			}
			defer closeStores()
			for _, a := range args {
				src := relaycore.Partition(a)
				st, err := relaycore.SourceRelayState(cmd.Context(), stores.Source, src, time.Now())
				if err != nil {
					return err
				}
				v, err := relaycore.InspectSource(cmd.Context(), stores.Source, src)
				if err != nil {
					return err
				}
				out := map[string]any{"source": a, "state": st, "view": v}
				b, _ := json.MarshalIndent(out, "", "  ")
				fmt.Fprintln(stdout, string(b))
			}
			return nil
		},
	}
	c.Flags().StringVar(&dbPath, "db", "", "bbolt file of an embedded relay")
	return c
}

// openStores opens the demo's source and target tables.
func openStores(ctx context.Context, kind, dbPath string, dyn dynamoOptions) (demo.Stores, func(), error) {
	switch kind {
	case "dynamo":
		return openDynamo(ctx, dyn)
	case "bolt":
		cleanup := func() {}
		if dbPath == "" {
			dir, err := os.MkdirTemp("", "relay-demo-")
			if err != nil {
				return demo.Stores{}, nil, err
			}
			dbPath = filepath.Join(dir, "relay.db")
			cleanup = func() { os.RemoveAll(dir) }
		}
		db, err := openBolt(dbPath)
		if err != nil {
			cleanup()
			return demo.Stores{}, nil, err
		}
		src := db.Store("source")
		return demo.Stores{Source: src, Target: db.Store("target"), Index: src, Name: "bolt:" + dbPath},
			func() { db.Close(); cleanup() }, nil
	default:
		return demo.Stores{}, nil, fmt.Errorf("--store %q: want bolt or dynamo", kind)
	}
}

func printSummary(w io.Writer, s demo.Summary) {
	fmt.Fprintf(w, `
summary (%s, plan %s, seed %d)
  rows enqueued      %d in %d batches (%d re-plans after os races)
  rows delivered     %d to %d targets from %d sources
  alarms / fires     %d / %d (%d kicks)
  target calls       %d (%d injected failures, %d blocked-target events)
  store calls        source %d, target %d
  lag at apply       p50 %d ms, p99 %d ms, max %d ms
  elapsed            %.2fs (%.0f rows/s delivered)
  verified           %s
`, s.Store, s.Plan, s.Seed, s.RowsEnqueued, s.EnqueueBatches, s.EnqueueReplans, s.RowsDelivered, s.Targets, s.Sources,
		s.Alarms, s.Fires, s.Kicks, s.TargetCalls, s.TargetFailures, s.BlockedEvents,
		s.SourceStoreCalls, s.TargetStoreCalls, s.LagP50MS, s.LagP99MS, s.LagMaxMS,
		float64(s.ElapsedMS)/1000, s.RowsPerSecond, verdict(s))
	if s.InjectedThrottles > 0 || s.InjectedDrops > 0 {
		fmt.Fprintf(w, "  injected faults    %d throttled requests, %d dropped responses (%d demo retries)\n",
			s.InjectedThrottles, s.InjectedDrops, s.DemoRetries)
	}
	if s.WriteUnitsPerRow > 0 {
		fmt.Fprintf(w, "  DynamoDB units     %.2f write, %.2f read per enqueued row (includes the injected failures' retries)\n",
			s.WriteUnitsPerRow, s.ReadUnitsPerRow)
	}
}

func verdict(s demo.Summary) string {
	switch {
	case s.Verified:
		return "true (every target key matches the newest row written)"
	case s.Error != "":
		return "false: " + s.Error
	}
	return "false"
}

// singleDashHint turns pflag's "unknown shorthand flag: 'c' in
// -check-config" into advice when the word is one of the command's long
// flags: edged and the Go tools take -flag, relay's cobra commands
// --flag, and an operator moving between them types the other.
func singleDashHint(cmd *cobra.Command, err error) error {
	_, word, ok := strings.Cut(err.Error(), "unknown shorthand flag: ")
	if !ok {
		return err
	}
	_, word, ok = strings.Cut(word, " in -")
	if !ok {
		return err
	}
	name, _, _ := strings.Cut(word, "=")
	if cmd.Flags().Lookup(name) == nil {
		return err
	}
	return fmt.Errorf("%w: long flags take two dashes: --%s", err, name)
}
