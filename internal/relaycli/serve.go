package relaycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/internal/relayserve"
)

// serveCmd is `relay serve` (internal/relayserve, docs/serve.md).
func serveCmd(stdout, stderr io.Writer) *cobra.Command {
	var configPath, readyFile string
	var check bool
	c := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run the relay as a self-hosted server: HTTP API, alarm clock and sweeper on bbolt, PostgreSQL or DynamoDB",
		Long: `serve runs the embedded relay as a server (docs/serve.md): the HTTP API of the
function URL, authenticated by client certificates or bearer tokens, the in-process
alarm clock and sweeper, /healthz, /readyz and Prometheus /metrics. JSON logs go to
stderr. SIGTERM or SIGINT drains: in-flight requests and fires finish (within
drain_timeout), then the store closes. SIGHUP re-reads the configuration and
applies principals and auth (roles, tokens file, anonymous access) with the
current tokens file, client CA and server certificate, all or nothing; a change
to any other key is refused and logged: it needs a restart.

--check-config loads the configuration and every file it names, prints every problem
(with its line in the file) and exits non-zero if there is one, without creating or
writing anything: on bbolt it checks that the files' directories exist; on PostgreSQL
it connects and checks that the schema is one this release knows and that the role
has the privileges the relay needs; on DynamoDB it checks both tables' layout and
that they can be read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("--config is required")
			}
			cfg, err := relayserve.LoadAndCheck(configPath)
			if err != nil {
				return err
			}
			if check {
				notes, err := relayserve.CheckStore(cmd.Context(), cfg)
				if err != nil {
					return fmt.Errorf("%s: %w", configPath, err)
				}
				for _, n := range notes {
					fmt.Fprintf(stdout, "%s: %s\n", configPath, n)
				}
				_, err = fmt.Fprintf(stdout, "%s: ok\n", configPath)
				return err
			}
			if percent, ok := serveGCPercent(os.Getenv("GOGC")); ok {
				debug.SetGCPercent(percent)
			}
			level, _ := cfg.Level()
			logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
			// SIGHUP reloads the roles and the credential files
			// (relayserve.Options.Reload) instead of ending the process.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			reload, done := make(chan struct{}), make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-hup:
						select {
						case reload <- struct{}{}:
						case <-done:
							return
						}
					case <-done:
						return
					}
				}
			}()
			return relayserve.Run(cmd.Context(), cfg, relayserve.Options{
				Logger: logger, ReadyFile: readyFile, Reload: reload, ConfigPath: configPath,
			})
		},
	}
	c.Flags().StringVar(&configPath, "config", "", "YAML configuration file (docs/serve.md)")
	c.Flags().BoolVar(&check, "check-config", false, "validate the configuration, the files it names and the database connection (writing nothing), then exit")
	c.Flags().StringVar(&readyFile, "ready-file", "", `write {"addr","url","pid"} JSON here once listening (removed on exit)`)
	c.AddCommand(tokenCmd(stdout))
	return c
}

// defaultServeGCPercent is relay serve's garbage collection target when
// the environment sets no GOGC: the heap may grow to 5 times what is live
// between collections instead of the runtime's 2. relay serve's live heap
// is small (about 5 MB under BenchmarkServeThroughputPostgres) and its
// request path allocates fast, so with the runtime's default the
// collector ran about every 4 MB allocated and took a sixth of the CPU;
// at 400 relay serve spent 16-20% less CPU per delivered row there, for
// 13 MB more resident memory (docs/serve.md, Memory).
const defaultServeGCPercent = 400

// serveGCPercent is the GC percent relay serve sets, and false when GOGC
// (gogc, the environment's) is set: the runtime follows it already.
func serveGCPercent(gogc string) (int, bool) {
	if gogc != "" {
		return 0, false
	}
	return defaultServeGCPercent, true
}

// tokenCmd mints a bearer token.
func tokenCmd(stdout io.Writer) *cobra.Command {
	var principal string
	var asJSON bool
	c := &cobra.Command{
		Use:   "token --principal NAME",
		Short: "Mint a bearer token: prints the token (give it to the client) and the tokens-file line (give it to the server)",
		Long: `token mints a bearer token for a principal of the server's configuration and
prints it with the line the server's tokens file needs (auth.tokens_file; docs/serve.md,
"Authentication"). The token is shown only here: the file keeps its SHA-256 digest.
--json prints {"principal","token","tokens_file_line"} instead of two labelled lines.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if principal == "" {
				return usageErrorf("--principal is required")
			}
			token, line, err := relayserve.MintToken(principal)
			if err != nil {
				return &usageError{fmt.Errorf("--principal: %w", err)} // only the name can be wrong
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Principal string `json:"principal"`
					Token     string `json:"token"`
					Line      string `json:"tokens_file_line"`
				}{principal, token, line})
			}
			_, err = fmt.Fprintf(stdout, "token: %s\ntokens_file line: %s\n", token, line)
			return err
		},
	}
	c.Flags().StringVar(&principal, "principal", "", "principal the token authenticates as (a key of principals in the server config)")
	c.Flags().BoolVar(&asJSON, "json", false, `print {"principal","token","tokens_file_line"} as JSON (and a JSON error object when minting fails)`)
	return c
}
