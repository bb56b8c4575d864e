package relaycli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// The operator commands (relay targets, relay target, relay archive) run
// the HTTP API's handler in process (api.Handler.Serve with every route)
// on a bbolt file or DynamoDB tables, or send the same requests to a
// running relay serve (--url), so they validate, refuse and answer exactly
// as the operator endpoint does: --json prints the API's response body.

// opFlags are the flags every operator command shares.
type opFlags struct {
	store, db           string
	endpoint, prefix    string
	source, by, reason  string
	asJSON              bool
	skipFirst, skipLast uint64
	server              serverFlags
}

func (f *opFlags) register(c *cobra.Command, withActor bool) {
	fl := c.Flags()
	fl.StringVar(&f.store, "store", "bolt", "store backend: bolt or dynamo")
	fl.StringVar(&f.db, "db", "", "bbolt file of an embedded relay (--store bolt)")
	fl.StringVar(&f.endpoint, "endpoint", "aws", `DynamoDB endpoint URL for --store dynamo ("aws" = the SDK default, with your AWS credentials)`)
	fl.StringVar(&f.prefix, "table-prefix", "relay-", "DynamoDB table name prefix for --store dynamo: the tables are <prefix>source and <prefix>target (a stack's TablePrefix followed by -)")
	fl.StringVar(&f.source, "source", "", "source id (required)")
	fl.BoolVar(&f.asJSON, "json", false, "print the API's JSON answer (and a JSON error object when the command fails)")
	if withActor {
		fl.StringVar(&f.by, "by", "", "who does this, recorded with the action (default: the OS user; not with --url: the server records the principal that authenticated)")
		fl.StringVar(&f.reason, "reason", "", "why, recorded with the action (at most 256 bytes)")
	}
	f.server.register(c, "a principal with the operate role (and read, for archive show and export)")
}

// operator is an open store with the API handler over it, or a running
// server: serve answers one API request either way.
type operator struct {
	serve func(context.Context, api.Request) (api.Response, error)
	close func()
	// headers are sent with every request besides content-type.
	headers map[string]string
}

// open opens the stores named by the flags, or dials the server of --url.
// Tables and files must exist: an operator command never creates a relay.
func (f *opFlags) open(cmd *cobra.Command) (*operator, error) {
	ctx := cmd.Context()
	if f.source == "" {
		return nil, usageErrorf("--source is required")
	}
	if err := f.server.credentialsWithoutURL(); err != nil {
		return nil, err
	}
	if f.server.url != "" {
		for _, name := range []string{"store", "db", "endpoint", "table-prefix", "by"} {
			if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
				if name == "by" {
					return nil, usageErrorf("--by does not go with --url: the server records the principal that authenticated as the actor")
				}
				return nil, usageErrorf("--%s does not go with --url: the server at --url has its own store", name)
			}
		}
		srv, err := f.server.dial()
		if err != nil {
			return nil, err
		}
		return &operator{serve: srv.serve, close: func() { srv.client.CloseIdleConnections() }}, nil
	}
	var (
		src, dst relaycore.Store
		closeFn  func()
	)
	switch f.store {
	case "bolt":
		if f.db == "" {
			return nil, usageErrorf("--db is required (or --url for a running relay serve)")
		}
		if err := needExistingDB(f.db); err != nil {
			return nil, err
		}
		db, err := openBolt(f.db)
		if err != nil {
			return nil, err
		}
		src, dst, closeFn = db.Store("source"), db.Store("target"), func() { db.Close() }
	case "dynamo":
		if f.db != "" {
			return nil, usageErrorf("--db needs --store bolt")
		}
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("aws config: %w", err)
		}
		if f.endpoint != "aws" {
			if u, err := url.Parse(f.endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, usageErrorf("--endpoint %q: want aws or an http(s) URL", f.endpoint)
			}
		}
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
			if f.endpoint != "aws" {
				o.BaseEndpoint = aws.String(f.endpoint)
			}
		})
		for _, t := range []string{f.prefix + "source", f.prefix + "target"} {
			if _, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t)}); err != nil {
				return nil, fmt.Errorf("table %s (--table-prefix %q): %w", t, f.prefix, err)
			}
		}
		src, dst = dynamo.New(client, f.prefix+"source", dynamo.Options{}), dynamo.New(client, f.prefix+"target", dynamo.Options{})
		closeFn = func() {}
	default:
		return nil, usageErrorf("--store %q: want bolt or dynamo", f.store)
	}
	by := f.by
	if by == "" {
		by = osUser()
	}
	// No Kicker: a release, resume or requeue makes the source's durable
	// alarm due now; the sweep (DynamoDB) or `relay fire` (bbolt) runs it.
	// Operator actions deliver nothing themselves: no budget.
	relay := &relaycore.RelayHandler{Source: src, Target: dst}
	h := &api.Handler{Source: src, Relay: relay, Routes: api.RoutesAll}
	serve := func(ctx context.Context, r api.Request) (api.Response, error) {
		r.Caller = by
		return h.Serve(ctx, r), nil
	}
	return &operator{serve: serve, close: closeFn}, nil
}

func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}

// apiError is an API refusal as the CLI reports it.
type apiError struct {
	status int
	body   api.ErrorBody
}

func (e *apiError) Error() string {
	// The message names what the caller needs (the actual first seq of a
	// skip conflict included).
	msg := fmt.Sprintf("%s (%d %s)", e.body.Error.Message, e.status, e.body.Error.Code)
	if d := e.body.Error; d.Code == "skip_conflict" && d.ActualFirst != nil && *d.ActualFirst == 0 {
		msg += "; nothing is held for this target, so there is nothing to skip: `relay targets show` lists what is held"
	}
	return msg
}

// call serves one API request and decodes a 200 body into out.
func (o *operator) call(ctx context.Context, method, path string, query url.Values, body any, out any) ([]byte, error) {
	req := api.Request{Method: method, Path: path, Query: query.Encode(),
		Headers: map[string]string{"content-type": "application/json"}}
	for k, v := range o.headers {
		req.Headers[k] = v
	}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		req.Body = b
	}
	resp, err := o.serve(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Status != 200 {
		e := &apiError{status: resp.Status}
		if err := json.Unmarshal(resp.Body, &e.body); err != nil {
			return nil, fmt.Errorf("%d %s", resp.Status, resp.Body)
		}
		return nil, e
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body, out); err != nil {
			return nil, err
		}
	}
	return resp.Body, nil
}

// operate runs one operator command that is one API request: it opens the
// stores named by f, serves the request and prints the answer, the API's
// body with --json and otherwise what show makes of the decoded response.
func operate[R any](cmd *cobra.Command, f *opFlags, stdout io.Writer, method, path string, query url.Values, body any, show func(R) error) error {
	o, err := f.open(cmd)
	if err != nil {
		return err
	}
	defer o.close()
	var res R
	raw, err := o.call(cmd.Context(), method, path, query, body, &res)
	if err != nil {
		return err
	}
	if f.asJSON {
		return printJSON(stdout, raw)
	}
	return show(res)
}

func sourcePath(source string, rest ...string) string {
	p := "/v1/sources/" + url.PathEscape(source)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

func printJSON(w io.Writer, raw []byte) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func msTime(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

// operatorLong is the common help of the operator command groups.
const operatorLong = `The operator commands work on an embedded relay's bbolt file (--db FILE), on a
stack's DynamoDB tables (--store dynamo --table-prefix P) or on a running relay serve
(--url URL with --token-file or --cert/--key, and --ca), through the same API handler,
so they answer alike. --json prints the API's answer, and a JSON error object when the
command fails. The runbook: docs/operations.md.`

func targetsCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{Use: "targets", Short: "See a source's targets: their state, pending and held rows, last error", Long: operatorLong}
	var f opFlags
	var state, after string
	var all bool
	var limit int
	list := &cobra.Command{
		Use:   "list --source SOURCE",
		Short: "List targets with undelivered rows, not active, or failed in the last day (--all: every target)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			if state != "" {
				q.Set("state", state)
			}
			if all {
				q.Set("all", "true")
			}
			if after != "" {
				q.Set("after", after)
			}
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.Itoa(limit))
			}
			return operate(cmd, &f, stdout, "GET", sourcePath(f.source, "targets"), q, nil, func(res api.TargetsResponse) error {
				tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TARGET\tSTATE\tPENDING\tHELD\tFIRST SEQ\tOLDEST\tFAILED ROUNDS\tLAST ERROR")
				for _, t := range res.Targets {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\n", t.Target, t.State, t.Pending, t.Held, t.FirstSeq,
						msTime(t.OldestMS), t.FailedRounds, lastError(t.LastError))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if res.Next != "" {
					fmt.Fprintf(stdout, "more: --after %q\n", res.Next)
				}
				return nil
			})
		},
	}
	f.register(list, false)
	list.Flags().StringVar(&state, "state", "", "only targets in this state: active, quarantined or paused")
	list.Flags().BoolVar(&all, "all", false, "include idle targets")
	list.Flags().StringVar(&after, "after", "", "continue after this target (the previous page's last)")
	list.Flags().IntVar(&limit, "limit", 100, "targets per page (1..1000)")

	var sf opFlags
	show := &cobra.Command{
		Use:   "show --source SOURCE TARGET",
		Short: "Show one target's delivery state",
		Args:  oneTarget,
		RunE: func(cmd *cobra.Command, args []string) error {
			return operate(cmd, &sf, stdout, "GET", sourcePath(sf.source, "targets", args[0]), nil, nil, func(res api.TargetResponse) error {
				printStatus(stdout, res.Status)
				return nil
			})
		},
	}
	sf.register(show, false)
	c.AddCommand(list, show)
	return c
}

func lastError(e *relaycore.LastError) string {
	if e == nil {
		return "-"
	}
	return fmt.Sprintf("%s at seq %d, %s: %s", e.Class, e.Seq, msTime(e.AtMS), e.Message)
}

func printStatus(w io.Writer, t relaycore.TargetStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("target", t.Target)
	row("state", fmt.Sprintf("%s since %s", t.State, msTime(t.SinceMS)))
	row("pending", t.Pending)
	first := fmt.Sprint(t.FirstSeq)
	if !t.Exact {
		first += " (upper bound)"
	}
	row("first undelivered", fmt.Sprintf("seq %s, committed %s", first, msTime(t.OldestMS)))
	if t.Held > 0 {
		row("held", fmt.Sprintf("%d rows, seqs %d..%d", t.Held, t.HeldFirst, t.HeldLast))
	} else {
		row("held", 0)
	}
	row("delivered through", t.DeliveredThrough)
	row("enqueued / done / skipped", fmt.Sprintf("%d / %d / %d", t.Enqueued, t.Done, t.Skipped))
	row("failures", fmt.Sprintf("%d attempts, %d rounds in a row", t.FailedAttempts, t.FailedRounds))
	row("last error", lastError(t.LastError))
	if t.RetryMS != 0 {
		row("next retry", msTime(t.RetryMS))
	}
	if t.Released {
		row("redriving", "yes (released; a failure quarantines it again)")
	}
	if n := t.Note; n != nil {
		row("last action", fmt.Sprintf("%s by %s at %s: %s", n.Action, n.By, msTime(n.AtMS), n.Reason))
	}
	tw.Flush()
}

// oneTarget takes one argument, a target name by the engine's rule
// (relaycore.TargetNameProblem), checked before anything is sent.
func oneTarget(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	if reason := relaycore.TargetNameProblem(args[0]); reason != "" {
		return fmt.Errorf("TARGET %q: a target name %s", args[0], reason)
	}
	return nil
}

func targetCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{Use: "target", Short: "Act on one target: quarantine, release, pause, resume, skip", Long: operatorLong}
	for _, a := range []struct{ name, short string }{
		{"quarantine", "Hold the target's rows, existing and new, in order until released"},
		{"release", "Redrive a quarantined target's held rows, oldest first"},
		{"pause", "Stop delivery to the target on purpose (maintenance), counting no failures"},
		{"resume", "Continue delivery to a paused target, held rows first"},
	} {
		var f opFlags
		sub := &cobra.Command{
			Use:   a.name + " --source SOURCE TARGET",
			Short: a.short,
			Args:  oneTarget,
			RunE: func(cmd *cobra.Command, args []string) error {
				return operate(cmd, &f, stdout, "POST", sourcePath(f.source, "targets", args[0], a.name), nil, api.ActionRequest{Reason: f.reason}, func(res api.TargetResponse) error {
					fmt.Fprintf(stdout, "%s: %s %s\n", a.name, args[0], res.Status.State)
					printStatus(stdout, res.Status)
					return nil
				})
			},
		}
		f.register(sub, true)
		c.AddCommand(sub)
	}
	var f opFlags
	skip := &cobra.Command{
		Use:   "skip --source SOURCE TARGET --expect-first N --through M --reason WHY",
		Short: "Move a quarantined or paused target's held rows N..M to the dead-row archive, never applied",
		Long: `skip removes the held rows N..M of a quarantined or paused target from the outbox without
applying them, and copies them (with who, why, when and the target's last error) to the
source's dead-row archive in the same transaction. N must be the target's first undelivered
held seq ('relay targets show' prints it as held N..): if a delivery moved it meanwhile the
skip is refused and nothing changes.`,
		Args: oneTarget,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range []string{"expect-first", "through", "reason"} {
				if !cmd.Flags().Changed(name) {
					return usageErrorf("--%s is required", name)
				}
			}
			return operate(cmd, &f, stdout, "POST", sourcePath(f.source, "targets", args[0], "skip"), nil,
				api.SkipRequest{ExpectFirst: f.skipFirst, Through: f.skipLast, Reason: f.reason}, func(res api.SkipResponse) error {
					fmt.Fprintf(stdout, "skipped %d rows (seqs %d..%d) of %s into archive entry %d\n", res.Rows, res.First, res.Last, args[0], res.ArchiveID)
					printStatus(stdout, res.Status)
					return nil
				})
		},
	}
	f.register(skip, true)
	skip.Flags().Uint64Var(&f.skipFirst, "expect-first", 0, "the target's first undelivered held seq (required)")
	skip.Flags().Uint64Var(&f.skipLast, "through", 0, "the last seq to skip (required)")
	c.AddCommand(skip)
	return c
}

func archiveCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{Use: "archive", Short: "The dead-row archive: skipped rows with who, why and when", Long: operatorLong}
	var lf opFlags
	var after uint64
	var limit int
	list := &cobra.Command{
		Use:   "list --source SOURCE",
		Short: "List archive entries (without their rows)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			if after > 0 {
				q.Set("after", strconv.FormatUint(after, 10))
			}
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.Itoa(limit))
			}
			return operate(cmd, &lf, stdout, "GET", sourcePath(lf.source, "archive"), q, nil, func(res api.ArchiveListResponse) error {
				tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tTARGET\tSEQS\tROWS\tAT\tBY\tREASON\tREQUEUED AS")
				for _, e := range res.Entries {
					req := "-"
					if len(e.Requeued) > 0 {
						req = fmt.Sprintf("%d..%d", e.Requeued[0], e.Requeued[len(e.Requeued)-1])
					}
					fmt.Fprintf(tw, "%d\t%s\t%d..%d\t%d\t%s\t%s\t%s\t%s\n", e.ID, e.Target, e.First, e.Last, e.Rows, msTime(e.AtMS), e.By, e.Reason, req)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if res.Next != 0 {
					fmt.Fprintf(stdout, "more: --after %d\n", res.Next)
				}
				return nil
			})
		},
	}
	lf.register(list, false)
	list.Flags().Uint64Var(&after, "after", 0, "continue after this entry id")
	list.Flags().IntVar(&limit, "limit", 20, "entries per page (1..100)")

	var ef opFlags
	export := &cobra.Command{
		Use:   "export --source SOURCE > archive.json",
		Short: "Print the whole archive, rows included (values in base64), as one JSON document",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := ef.open(cmd)
			if err != nil {
				return err
			}
			defer o.close()
			doc, err := exportAll(cmd.Context(), o, ef.source)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(doc)
		},
	}
	ef.register(export, false)

	var rf opFlags
	requeue := &cobra.Command{
		Use:   "requeue --source SOURCE ID",
		Short: "Enqueue an archive entry's rows again for the same target (new seqs), once",
		Args: cobra.MatchAll(cobra.ExactArgs(1), func(_ *cobra.Command, args []string) error {
			if id, err := strconv.ParseUint(args[0], 10, 64); err != nil || id == 0 {
				return fmt.Errorf("ID %q: want an archive entry id, a decimal number ('relay archive list' prints them)", args[0])
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			return operate(cmd, &rf, stdout, "POST", sourcePath(rf.source, "archive", args[0], "requeue"), nil, struct{}{}, func(res api.RequeueResponse) error {
				fmt.Fprintf(stdout, "archive entry %d re-enqueued as seqs %s\n", res.ID, joinSeqs(res.Seqs))
				return nil
			})
		},
	}
	rf.register(requeue, false)
	c.AddCommand(list, export, requeue)
	return c
}

func joinSeqs(s []uint64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, ",")
}

// exportAll follows the export's pages and joins entries split across
// pages, so the document holds each entry once with all its rows.
func exportAll(ctx context.Context, o *operator, source string) (api.ArchiveExportResponse, error) {
	doc := api.ArchiveExportResponse{Source: source, Entries: []api.ArchiveEntryJSON{}}
	cursor := ""
	for {
		q := url.Values{}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page api.ArchiveExportResponse
		if _, err := o.call(ctx, "GET", sourcePath(source, "archive", "export"), q, nil, &page); err != nil {
			return doc, err
		}
		for _, e := range page.Entries {
			if n := len(doc.Entries); n > 0 && doc.Entries[n-1].ID == e.ID && e.RowsFrom > 0 {
				doc.Entries[n-1].Data = append(doc.Entries[n-1].Data, e.Data...)
				doc.Entries[n-1].Partial = e.Partial
				continue
			}
			doc.Entries = append(doc.Entries, e)
		}
		if page.Next == "" {
			return doc, nil
		}
		cursor = page.Next
	}
}
