package relaycli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// The takedown commands talk to a running relay serve (--url), whose
// takedown owner runs with its alarms: the caller needs the takedown role
// (docs/takedown.md). They send the API's takedown routes and print the
// answers; --json prints the API's body.

// takedownPrincipal is who the takedown routes answer.
const takedownPrincipal = "a principal with the takedown role"

type takedownFlags struct {
	server serverFlags
	asJSON bool
	reason string
	// idemKey: request's --idempotency-key.
	idemKey string
}

func (f *takedownFlags) register(c *cobra.Command, withReason bool) {
	f.server.register(c, takedownPrincipal)
	c.Flags().BoolVar(&f.asJSON, "json", false, "print the API's JSON answer (and a JSON error object when the command fails)")
	if withReason {
		c.Flags().StringVar(&f.reason, "reason", "", "why (required; recorded with the caller, who and when)")
	}
}

// call sends one takedown route to the server: the answer's body on 200.
func (f *takedownFlags) call(cmd *cobra.Command, method, path string, body any) ([]byte, error) {
	if f.server.url == "" {
		return nil, usageErrorf("--url is required: the takedown owner runs in relay serve")
	}
	srv, err := f.server.dial()
	if err != nil {
		return nil, err
	}
	defer srv.client.CloseIdleConnections()
	o := &operator{serve: srv.serve, close: func() {}}
	if f.idemKey != "" {
		o.headers = map[string]string{api.IdempotencyKeyHeader: f.idemKey}
	}
	return o.call(cmd.Context(), method, path, url.Values{}, body, nil)
}

const takedownLong = `Takedowns (docs/takedown.md): request one for a content id, follow its holders
until every one has proved its eviction with a signed receipt (or was waived), and
export the receipts for anyone to check with edgectl takedown verify FILE --ca ca.crt.
They talk to a running relay serve (--url with --token-file or --cert/--key, and
--ca) as a principal with the takedown role.`

func takedownCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{Use: "takedown", Short: "Request takedowns and follow them to every holder's receipt", Long: takedownLong}

	var rf takedownFlags
	req := &cobra.Command{
		Use: "request CONTENT_ID --reason WHY", Short: "Request a takedown: one order per holder the index knows, and late holders as they report",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rf.reason == "" {
				return usageErrorf("--reason is required")
			}
			raw, err := rf.call(cmd, "POST", "/v1/takedowns", api.TakedownRequest{ContentID: args[0], Reason: rf.reason})
			if err != nil || rf.asJSON {
				return printOr(stdout, raw, err)
			}
			var r api.TakedownResponse
			if err := json.Unmarshal(raw, &r); err != nil {
				return err
			}
			again := ""
			if r.Replayed {
				again = " (an earlier request with this --idempotency-key; nothing new was written)"
			}
			_, err = fmt.Fprintf(stdout, "takedown %s of %s requested by %s at %s: %d holders %v%s\n", r.ID, r.ContentID, r.RequestedBy, msTime(r.RequestedMS), len(r.Holders), r.Holders, again)
			return err
		},
	}
	rf.register(req, true)
	req.Flags().StringVar(&rf.idemKey, "idempotency-key", "", "makes the request safe to run again (a lost answer, a timeout): the same key, content and reason answer the takedown the first run opened instead of opening another ([A-Za-z0-9._:-], at most 128 bytes)")

	var sf takedownFlags
	status := &cobra.Command{
		Use: "status TAKEDOWN_ID", Short: "Who holds the content still: receipts verified M of N, pending holders with their last report, overdue",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := sf.call(cmd, "GET", "/v1/takedowns/"+url.PathEscape(args[0]), nil)
			if err != nil || sf.asJSON {
				return printOr(stdout, raw, err)
			}
			var st takedowns.Status
			if err := json.Unmarshal(raw, &st); err != nil {
				return err
			}
			done := "not complete"
			if st.Complete {
				done = "complete"
			}
			fmt.Fprintf(stdout, "takedown %s of %s: %s, %d of %d receipts verified, %d waived, %d pending, %d overdue\n",
				st.ID, st.ContentID, done, st.ReceiptsVerified, st.HoldersExpected, st.Waived, st.Pending, st.Overdue)
			fmt.Fprintf(stdout, "requested by %s at %s: %s\n", st.RequestedBy, msTime(st.RequestedMS), st.Reason)
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tSTATE\tLAST REPORT\tREQUEST\tORDERED\tOVERDUE\tEVICTED AT")
			for _, h := range st.Holders {
				fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%v\t%v\t%s\n", h.Node, h.State, msTime(h.LastReportMS), h.ReportState, h.Request, h.Ordered, h.Overdue, h.EvictedAt)
			}
			return tw.Flush()
		},
	}
	sf.register(status, false)

	var xf takedownFlags
	receipts := &cobra.Command{
		Use: "receipts TAKEDOWN_ID", Short: "Print the takedown's verified receipts as a receipt file (edgectl takedown verify FILE --ca ca.crt)",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if xf.server.url == "" {
				return usageErrorf("--url is required: the takedown owner runs in relay serve")
			}
			srv, err := xf.server.dial()
			if err != nil {
				return err
			}
			defer srv.client.CloseIdleConnections()
			resp, err := srv.serve(cmd.Context(), api.Request{Method: "GET", Path: "/v1/takedowns/" + url.PathEscape(args[0]) + "/receipts"})
			if err != nil {
				return err
			}
			if resp.Status != 200 {
				e := &apiError{status: resp.Status}
				if err := json.Unmarshal(resp.Body, &e.body); err != nil {
					return fmt.Errorf("%d %s", resp.Status, resp.Body)
				}
				return e
			}
			_, err = stdout.Write(resp.Body)
			return err
		},
	}
	xf.server.register(receipts, takedownPrincipal)

	var wf takedownFlags
	waive := &cobra.Command{
		Use: "waive TAKEDOWN_ID NODE --reason WHY", Short: "Waive one holder's receipt (a device gone for good): recorded with who, when and why",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wf.reason == "" {
				return usageErrorf("--reason is required")
			}
			raw, err := wf.call(cmd, "POST", "/v1/takedowns/"+url.PathEscape(args[0])+"/waive", api.WaiveRequest{Node: args[1], Reason: wf.reason})
			if err != nil || wf.asJSON {
				return printOr(stdout, raw, err)
			}
			var r api.WaiveResponse
			if err := json.Unmarshal(raw, &r); err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s waived in takedown %s by %s at %s: %s\n", r.Node, r.Takedown, r.Waiver.By, msTime(r.Waiver.AtMS), r.Waiver.Reason)
			return err
		},
	}
	wf.register(waive, true)

	var hf takedownFlags
	holders := &cobra.Command{
		Use: "holders CONTENT_ID", Short: "The holder index for one content: every node that reported it, held or evicted",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := hf.call(cmd, "GET", "/v1/holdings/"+url.PathEscape(args[0]), nil)
			if err != nil || hf.asJSON {
				return printOr(stdout, raw, err)
			}
			var r api.HoldersResponse
			if err := json.Unmarshal(raw, &r); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tSTATE\tSHA256\tSIZE\tOBSERVED\tREPORTED")
			for _, h := range r.Holders {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", h.Node, h.State, h.SHA256, h.Size, msTime(h.ObservedMS), msTime(h.ReportedMS))
			}
			return tw.Flush()
		},
	}
	hf.register(holders, false)

	c.AddCommand(req, status, receipts, waive, holders)
	return c
}

// printOr prints raw (the API's answer, --json) or returns err.
func printOr(w io.Writer, raw []byte, err error) error {
	if err != nil {
		return err
	}
	return printJSON(w, raw)
}
