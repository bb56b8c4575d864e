package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/wire"
)

// exitNotMet is `edgectl assurance --check`'s exit code when the success
// condition does not hold, distinct from 1 (error).
const exitNotMet = 3

// errNotMet carries exitNotMet.
var errNotMet = errors.New("success condition not met")

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errNotMet):
		return exitNotMet
	}
	fmt.Fprintln(stderr, "edgectl:", err)
	return 1
}

// globals are the persistent flags.
type globals struct {
	rpc    string
	config string
	json   bool
	out    io.Writer
}

// client resolves the RPC address: --rpc, else the config's rpc.listen,
// else edge/config's default.
func (g *globals) client() (*rpc.Client, error) {
	addr := g.rpc
	if addr == "" && g.config != "" {
		cfg, err := config.Load(g.config)
		if err != nil {
			return nil, err
		}
		addr = cfg.RPC.Listen
	}
	if addr == "" {
		addr = config.DefaultRPCListen
	}
	return rpc.NewClient(addr), nil
}

// call runs f with a client and prints its result as JSON (--json) or
// with text.
func call[T any](g *globals, cmd *cobra.Command, f func(*rpc.Client, context.Context) (T, error), text func(io.Writer, T)) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
	defer cancel()
	v, err := f(c, ctx)
	if err != nil {
		return err
	}
	if g.json {
		enc := json.NewEncoder(g.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	text(tw, v)
	return tw.Flush()
}

func newRoot(stdout io.Writer) *cobra.Command {
	g := &globals{out: stdout}
	root := &cobra.Command{
		Use:           "edgectl",
		Short:         "Operate a running edged through its local RPC",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.rpc, "rpc", "", `edged RPC address: host:port or unix:/path (default: --config's rpc.listen, else `+config.DefaultRPCListen+`)`)
	root.PersistentFlags().StringVarP(&g.config, "config", "c", "", "edged config file to take rpc.listen from")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print the RPC's JSON reply")
	root.AddCommand(statusCmd(g), indexCmd(g), storageCmd(g), quotaCmd(g), ledgerCmd(g), deadletterCmd(g),
		segmentCmd(g), assuranceCmd(g), relayCmd(g), takedownCmd(g), pkiCmd(stdout))
	root.AddCommand(versionCmd(stdout))
	return root
}

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "status", Short: "Node, peers, ledger counts and storage use", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, (*rpc.Client).Status, func(w io.Writer, s rpc.Status) {
				fmt.Fprintf(w, "node\t%s (%s)\n", s.NodeID, s.Version)
				fmt.Fprintf(w, "listen\t%s\n", s.Listen)
				fmt.Fprintf(w, "up since\t%s\n", s.StartedAt.Format(time.RFC3339))
				fmt.Fprintf(w, "condition\t%s (evict_on_relay %t)\n", s.SuccessCondition, s.EvictOnRelay)
				for _, p := range s.Peers {
					fmt.Fprintf(w, "peer\t%s at %s, %s%s\n", p.ID, p.Address, circuitLine(p), roomLine(p))
				}
				if len(s.AcceptFrom) > 0 {
					fmt.Fprintf(w, "accepts from\t%s (inbound only)\n", strings.Join(s.AcceptFrom, ", "))
				}
				fmt.Fprintf(w, "segments\t%d stored, %d relayed\n", s.Segments, s.Relayed)
				fmt.Fprintf(w, "storage\t%s\n", usageLine(s.Usage))
				fmt.Fprintf(w, "ledger\tscheduled %d, inflight %d, failed %d, acked %d, deadletter %d, cancelled %d\n",
					s.Ledger["scheduled"], s.Ledger["inflight"], s.Ledger["failed"], s.Ledger["acked"], s.Ledger["deadletter"], s.Ledger["cancelled"])
				if a := s.RelayAPI; a != nil {
					fmt.Fprintf(w, "relay api\t%s (%s)\n", a.URL, a.Auth)
					fmt.Fprintf(w, "  holdings\t%d reports sent, %d pending%s\n", a.Holdings.Counts["sent"], a.Holdings.Pending, jobLine(a.Holdings))
					fmt.Fprintf(w, "  orders\tevicted %d, receipt %d, not_held %d, invalid %d%s\n", a.Orders.Counts["evicted"], a.Orders.Counts["receipt"],
						a.Orders.Counts["not_held"], a.Orders.Counts["invalid"], jobLine(a.Orders))
					fmt.Fprintf(w, "  receipts\taccepted %d, replayed %d, refused %d, %d pending%s\n", a.Receipts.Counts["accepted"], a.Receipts.Counts["replayed"],
						a.Receipts.Counts["refused"], a.Receipts.Pending, jobLine(a.Receipts))
				}
			})
		},
	}
}

// jobLine is a relay API job's last success, error and refusal.
func jobLine(j rpc.RelayAPIJob) string {
	var b strings.Builder
	if j.LastSuccess != nil {
		fmt.Fprintf(&b, "; last success %s", j.LastSuccess.Format(time.RFC3339))
	}
	if j.Failures > 0 {
		fmt.Fprintf(&b, "; failing (%d in a row, next attempt %s): %s", j.Failures, j.NextAttempt.Format(time.RFC3339), j.LastError)
	} else if j.LastErrorAt != nil {
		fmt.Fprintf(&b, "; last error %s: %s", j.LastErrorAt.Format(time.RFC3339), j.LastError)
	}
	if j.LastRefusalAt != nil {
		fmt.Fprintf(&b, "; last refused %s: %s", j.LastRefusalAt.Format(time.RFC3339), j.LastRefusal)
	}
	return b.String()
}

func usageLine(u rpc.Usage) string {
	return fmt.Sprintf("%d of %d bytes, %d of %d segments (reserved %d bytes), max segment %d bytes",
		u.Bytes, u.QuotaBytes, u.Segments, u.QuotaSegments, u.ReservedBytes, u.MaxSegmentBytes)
}

func indexCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "index", Short: "List stored segments", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, (*rpc.Client).Index, func(w io.Writer, ix rpc.Index) {
				fmt.Fprintln(w, "SEGMENT\tSIZE\tSHA256\tSOURCE\tRELAYED\tRECEIVED")
				for _, s := range ix.Segments {
					src := s.Source
					if src == "" {
						src = "(local)"
					}
					fmt.Fprintf(w, "%s\t%d\t%.16s…\t%s\t%t\t%s\n", s.ID, s.Size, s.SHA256, src, s.Relayed, s.Received.Format(time.RFC3339))
				}
			})
		},
	}
}

func storageCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "storage", Short: "Storage directory, use and start-up repairs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, (*rpc.Client).Storage, func(w io.Writer, s rpc.Storage) {
				fmt.Fprintf(w, "dir\t%s\nuse\t%s\n", s.Dir, usageLine(s.Usage))
				fmt.Fprintf(w, "previous stop\t%s\nverified at start\t%s\n", stopLine(s), verifiedLine(s.Verified))
				fmt.Fprintf(w, "packs\t%s\n", packsLine(s.Packs))
				for _, r := range [][2]any{{"removed temp", s.RemovedTemp}, {"removed orphans", s.RemovedOrphans},
					{"dropped entries", s.DroppedEntries}, {"unknown files", s.Unknown}} {
					if l := r[1].([]string); len(l) > 0 {
						fmt.Fprintf(w, "%s\t%s\n", r[0], strings.Join(l, " "))
					}
				}
				if s.DBMovedAside != "" {
					fmt.Fprintf(w, "database damaged\tmoved to %s: %s\n", s.DBMovedAside, oneLine(s.DBDamage))
				}
				if len(s.Rebuilt) > 0 {
					fmt.Fprintf(w, "index rebuilt\t%d segments from their files\n", len(s.Rebuilt))
				}
				if len(s.Unverified) > 0 {
					fmt.Fprintf(w, "no digest tag\t%s (indexed under their content's digest)\n", strings.Join(s.Unverified, " "))
				}
				for _, q := range s.Quarantined {
					when := ""
					if q.Found == "read" {
						when = " (found on read)"
					}
					fmt.Fprintf(w, "quarantined\t%s -> %s: %s%s\n", q.Segment, filepath.Join(s.QuarantineDir, q.File), oneLine(q.Reason), when)
				}
				for _, x := range s.Wanted {
					src := x.Source
					if src == "" {
						src = "local ingest"
					}
					fmt.Fprintf(w, "wanted back\t%s (%d bytes, from %s), lost %s\n", x.Segment, x.Size, src, x.Since.Format(time.RFC3339))
				}
			})
		},
	}
}

// stopLine says how the previous run ended. A daemon older than
// previous_stop sends only previous_stop_clean.
func stopLine(s rpc.Storage) string {
	switch {
	case s.PreviousStop == "none":
		return "none (a new store)"
	case s.PreviousStop == "clean" || s.PreviousStopClean:
		return "clean"
	}
	return "unclean (crash, kill or power loss)"
}

// verifiedLine says what was hashed at start: stored segments, whether
// files of their own or pack records.
func verifiedLine(n int) string {
	if n == 1 {
		return "1 segment hashed (segment files and pack records count alike)"
	}
	return fmt.Sprintf("%d segments hashed (segment files and pack records count alike)", n)
}

// packsLine says whether small segments are packed and what the packs
// hold; packs written before packing was turned off stay listed.
func packsLine(p rpc.Packs) string {
	state := "off (storage.pack_max_bytes: 0, or the file system cannot punch holes)"
	if p.Packing {
		state = fmt.Sprintf("on (segments up to %d bytes)", p.MaxBytes)
	}
	if !p.Packing && p.Files == 0 {
		return state
	}
	return fmt.Sprintf("%s; files %d, segments %d, records %d bytes, on disk %d bytes",
		state, p.Files, p.Segments, p.RecordBytes, p.DiskBytes)
}

func quotaCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "quota", Short: "Quota use and headroom", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, (*rpc.Client).Quota, func(w io.Writer, u rpc.Usage) {
				fmt.Fprintf(w, "use\t%s\nfree\t%d bytes, %d segments\n", usageLine(u), u.FreeBytes, u.FreeSegments)
			})
		},
	}
}

func printRecords(w io.Writer, rs rpc.Records) {
	fmt.Fprintln(w, "SEGMENT\tPEER\tSTATE\tATTEMPTS\tNEXT\tLAST ERROR")
	for _, r := range rs.Records {
		next := "-"
		if r.NextAttemptAfter != nil {
			next = r.NextAttemptAfter.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", r.Segment, r.Peer, r.State, r.Attempts, next, oneLine(r.LastError))
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}

func ledgerCmd(g *globals) *cobra.Command {
	var state string
	cmd := &cobra.Command{
		Use: "ledger", Short: "Delivery records (default: all but acked)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Records, error) {
				return c.Records(ctx, state)
			}, printRecords)
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only this state: scheduled, inflight, failed, acked, deadletter, cancelled, or all")
	return cmd
}

func deadletterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "deadletter", Short: "List, retry or purge deadlettered deliveries"}
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List deadlettered records", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, (*rpc.Client).Deadletter, printRecords)
		},
	})
	op := func(use, verb, short string, f func(*rpc.Client, context.Context, rpc.Selector) (rpc.Deadlettered, error)) *cobra.Command {
		var sel rpc.Selector
		c := &cobra.Command{
			Use: use, Short: short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				switch {
				case sel.All && (sel.Segment != "" || sel.Peer != ""):
					return errors.New("--all selects every deadlettered record; give it without --segment and --peer")
				case !sel.All && sel.Segment == "" && sel.Peer == "":
					return errors.New("name --segment and/or --peer, or --all for every deadlettered record")
				}
				return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Deadlettered, error) {
					return f(c, ctx, sel)
				}, func(w io.Writer, d rpc.Deadlettered) {
					if d.Count == 0 {
						fmt.Fprintf(w, "%s 0 record(s): none of the selected records is deadlettered\n", verb)
						return
					}
					fmt.Fprintf(w, "%s %d record(s):\n", verb, d.Count)
					for _, r := range d.Records {
						fmt.Fprintf(w, "  %s\t%s\tattempts %d\t%s\n", r.Segment, r.Peer, r.Attempts, oneLine(r.LastError))
					}
				})
			},
		}
		c.Flags().StringVar(&sel.Segment, "segment", "", "only this segment")
		c.Flags().StringVar(&sel.Peer, "peer", "", "only this peer (a peer without ledger records is an error)")
		c.Flags().BoolVar(&sel.All, "all", false, "every deadlettered record")
		return c
	}
	cmd.AddCommand(
		op("retry", "retried", "Schedule deadlettered records again with a fresh retry budget", (*rpc.Client).RetryDeadletter),
		op("purge", "purged", "Delete deadlettered records (give up on them)", (*rpc.Client).PurgeDeadletter),
	)
	return cmd
}

func relayCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "relay", Short: "Act on outbound delivery"}
	var peer string
	resend := &cobra.Command{
		Use:   "resend SEGMENT --peer P",
		Short: "Send a stored segment to a peer again, although the ledger says the peer has it",
		Long: "For a peer that lost its copy after acknowledging it (it found it damaged: its edgectl storage\n" +
			"lists it as wanted back). The record is scheduled at once with a fresh retry budget; a peer\n" +
			"that holds the segment after all acknowledges it again. Peers speaking wire version 3 ask for\n" +
			"such a copy themselves; this is for older peers and for a peer this node cannot be asked by.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if peer == "" {
				return errors.New("--peer is required: the peer to send the segment to")
			}
			req := rpc.ResendRequest{Segment: args[0], Peer: peer}
			return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Resent, error) {
				return c.Resend(ctx, req)
			}, func(w io.Writer, r rpc.Resent) {
				if !r.Resent {
					fmt.Fprintf(w, "%s to %s is being sent right now (attempt %d): nothing to do\n", r.Record.Segment, r.Record.Peer, r.Record.Attempts)
					return
				}
				fmt.Fprintf(w, "%s to %s scheduled again (attempts so far %d, fresh retry budget)\n", r.Record.Segment, r.Record.Peer, r.Record.Attempts)
			})
		},
	}
	resend.Flags().StringVar(&peer, "peer", "", "the peer to send it to (in known_peers)")
	cmd.AddCommand(resend)
	return cmd
}

func segmentCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "segment", Short: "Ingest segments"}
	var id string
	var byPath bool
	put := &cobra.Command{
		Use:   "put FILE",
		Short: "Store a local file as a segment and relay it to the known peers",
		Long: "Uploads FILE's bytes to edged (default), or with --by-path asks edged to read the file itself,\n" +
			"which edged allows only for regular files inside its rpc.ingest_dirs (symlinks resolved).\n" +
			"The segment id defaults to the file's base name.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			if id == "" {
				id = filepath.Base(path)
			}
			return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Ingested, error) {
				if byPath {
					abs, err := filepath.Abs(path)
					if err != nil {
						return rpc.Ingested{}, err
					}
					return c.PutPath(ctx, abs, id)
				}
				return upload(ctx, c, path, id)
			}, func(w io.Writer, in rpc.Ingested) {
				verb := "stored"
				if in.Duplicate {
					verb = "already stored"
				}
				fmt.Fprintf(w, "%s\t%s (%d bytes, sha256 %s)\n", verb, in.Segment.ID, in.Segment.Size, in.Segment.SHA256)
			})
		},
	}
	put.Flags().StringVar(&id, "id", "", "segment id (default: the file's base name)")
	put.Flags().BoolVar(&byPath, "by-path", false, "let edged read the file (it must be inside edged's rpc.ingest_dirs and readable by edged's user)")
	cmd.AddCommand(put)
	return cmd
}

// upload hashes the file, then streams it; the daemon verifies the digest,
// so a file changed in between is refused.
func upload(ctx context.Context, c *rpc.Client, path, id string) (rpc.Ingested, error) {
	f, err := os.Open(path)
	if err != nil {
		return rpc.Ingested{}, err
	}
	defer f.Close()
	size, sum, err := wire.Digest(f)
	if err != nil {
		return rpc.Ingested{}, fmt.Errorf("read %s: %w", path, err)
	}
	return c.PutSegment(ctx, id, size, sum, f)
}

func assuranceCmd(g *globals) *cobra.Command {
	var check bool
	cmd := &cobra.Command{
		Use:   "assurance SEGMENT",
		Short: "Which peers acknowledged a segment, and whether the success condition holds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var met bool
			err := call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Assurance, error) {
				a, err := c.Assurance(ctx, args[0])
				met = a.Met
				return a, err
			}, func(w io.Writer, a rpc.Assurance) {
				fmt.Fprintf(w, "segment\t%s (stored %t, relayed %t)\n", a.Segment, a.Stored, a.Relayed)
				fmt.Fprintf(w, "condition\t%s over %v: met %t\n", a.Condition, a.RequiredPeers, a.Met)
				fmt.Fprintf(w, "acked by\t%v\n", a.AckedPeers)
				for _, r := range a.Records {
					fmt.Fprintf(w, "  %s\t%s\tattempts %d\t%s\n", r.Peer, r.State, r.Attempts, oneLine(r.LastError))
				}
			})
			if err == nil && check && !met {
				return errNotMet
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "exit with status 3 when the condition is not met")
	return cmd
}

func pkiCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pki",
		Short: "Create a development CA and node, server and client certificates",
		Long: "A development PKI for trying edged and relay serve out: keys are plain files and there is no revocation.\n" +
			"Production fleets should issue certificates from their own CA with the same identity URI\n" +
			"(spiffe://relay/node/<node-id>).",
	}
	var force bool
	initCmd := &cobra.Command{
		Use: "init DIR", Short: "Create ca.crt and ca.key in DIR", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := pki.InitCA(args[0], pki.Options{Overwrite: force})
			if err != nil {
				return forceHint(err)
			}
			fmt.Fprintf(stdout, "wrote %s\nwrote %s (keep it private)\n", p.Cert, p.Key)
			return nil
		},
	}
	initCmd.Flags().BoolVar(&force, "force", false, "overwrite existing files")
	var dir, usage string
	var hosts []string
	var validity time.Duration
	issue := &cobra.Command{
		Use: "issue NAME --usage node|server|client", Short: "Issue DIR/NAME.crt and DIR/NAME.key, signed by the CA in DIR", Args: cobra.ExactArgs(1),
		Long: "Issue a certificate for one use, which --usage names (there is no default):\n" +
			"  node    an edge agent's: edged both dials and accepts, so client and server auth\n" +
			"  server  a listener's, such as relay serve's: server auth only, for the --host names\n" +
			"  client  a caller's, such as a relay serve client's: client auth only, no host names\n" +
			"A certificate valid for server auth lets whoever holds its key answer clients that trust the CA,\n" +
			"so callers get client certificates that cannot serve.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if usage == "" {
				return errors.New("say what the certificate is for: --usage node (an edge agent: dials and accepts), server (a listener such as relay serve) or client (a caller of relay serve: client auth only); nothing was written")
			}
			u, err := pki.ParseUsage(usage)
			if err != nil {
				return err
			}
			p, err := pki.Issue(dir, args[0], pki.Options{Usage: u, Overwrite: force, Hosts: hosts, Validity: validity})
			if err != nil {
				return forceHint(err)
			}
			fmt.Fprintf(stdout, "wrote %s\nwrote %s\n", p.Cert, p.Key)
			return nil
		},
	}
	issue.Flags().StringVar(&dir, "dir", ".", "directory holding the CA (from pki init)")
	issue.Flags().StringVar(&usage, "usage", "", "what the certificate is for: node, server or client (required)")
	issue.Flags().StringSliceVar(&hosts, "host", nil, "DNS name or IP clients dial the certificate's holder by (node and server: default localhost,127.0.0.1, and the name is always a DNS name too, the TLS server name clients send; client: none)")
	issue.Flags().DurationVar(&validity, "validity", 0, "certificate lifetime (default 1 year, capped at the CA's)")
	issue.Flags().BoolVar(&force, "force", false, "overwrite existing files")
	cmd.AddCommand(initCmd, issue)
	return cmd
}

// forceHint names the flag that replaces existing files, which the pki
// package knows only as Options.Overwrite.
func forceHint(err error) error {
	if errors.Is(err, pki.ErrExists) {
		return fmt.Errorf("%w; nothing was written (--force replaces it)", err)
	}
	return err
}

// roomLine describes a peer's room circuit when it is not closed: the
// peer refuses segments for want of room.
func roomLine(p rpc.Peer) string {
	if p.Room == "" || p.Room == "closed" {
		return ""
	}
	if p.Room == "open" && p.RoomReopenAt != nil {
		return fmt.Sprintf("; full (%d refusing rounds), asked again at %s", p.RoomRefusals, p.RoomReopenAt.Format(time.RFC3339))
	}
	return fmt.Sprintf("; full (%d refusing rounds), the next due record asks", p.RoomRefusals)
}

// circuitLine describes a peer's dial circuit in a few words.
func circuitLine(p rpc.Peer) string {
	switch {
	case (p.Circuit == "" || p.Circuit == "closed") && p.NotDialed:
		return "not dialled since the agent started (nothing owed to it came due)"
	case p.Circuit == "" || p.Circuit == "closed":
		return "reachable"
	case p.Probing:
		return fmt.Sprintf("unreachable (%d failed dial rounds), probing now; last: %s", p.DialFailures, oneLine(p.LastDialError))
	case p.ReopenAt != nil && p.Circuit == "open":
		return fmt.Sprintf("unreachable (%d failed dial rounds), next dial at %s; last: %s",
			p.DialFailures, p.ReopenAt.Format(time.RFC3339), oneLine(p.LastDialError))
	}
	return fmt.Sprintf("unreachable (%d failed dial rounds), next due record probes; last: %s", p.DialFailures, oneLine(p.LastDialError))
}
