package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/takedown"
)

func takedownCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "takedown",
		Short: "Evict segments for takedown requests; list and verify signed eviction receipts",
	}
	cmd.AddCommand(takedownEvictCmd(g), takedownReceiptsCmd(g), takedownVerifyCmd(g))
	return cmd
}

func takedownEvictCmd(g *globals) *cobra.Command {
	var request string
	c := &cobra.Command{
		Use:   "evict SEG --request ID",
		Short: "Evict a stored segment for a takedown request and print its signed receipt",
		Long: "Evict SEG for the takedown request ID, through the running edged: its index entry and content go,\n" +
			"its deliveries to every peer are cancelled (not failed, not retried), a tombstone refuses any later\n" +
			"offer of it (NACK evicted) or ingest, and a receipt signed with this node's key is stored\n" +
			"(edgectl takedown receipts). Asking again for the same request returns the same receipt; a segment\n" +
			"this node never held is an error, and nothing is signed for it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if request == "" {
				return errors.New("--request: the takedown request id is required")
			}
			return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.TakedownReply, error) {
				return c.Takedown(ctx, rpc.TakedownRequest{Segment: args[0], Request: request})
			}, func(w io.Writer, r rpc.TakedownReply) {
				what := "evicted"
				if !r.Evicted {
					what = "taken down before"
				}
				fmt.Fprintf(w, "segment\t%s (%d bytes, sha256 %s)\n", r.Segment, r.Size, r.SHA256)
				fmt.Fprintf(w, "%s\tat %s for request %s\n", what, r.EvictedAt.UTC().Format(time.RFC3339Nano), r.Request)
				if r.Evicted {
					fmt.Fprintf(w, "deliveries cancelled\t%d\n", r.Cancelled)
				}
				fmt.Fprintf(w, "receipt\t%s\n", r.Receipt)
			})
		},
	}
	c.Flags().StringVar(&request, "request", "", "the takedown request id the receipt names")
	return c
}

func takedownReceiptsCmd(g *globals) *cobra.Command {
	var segment string
	var lines bool
	c := &cobra.Command{
		Use:   "receipts [--segment SEG] [--json-lines]",
		Short: "List the signed takedown receipts this node stored",
		Long: "List the receipts of the segments this node took down. --json-lines prints them as a receipt file\n" +
			"(one receipt per line), which `edgectl takedown verify FILE --ca ca.crt` checks offline.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lines {
				c, err := g.client()
				if err != nil {
					return err
				}
				defer c.Close()
				rs, err := c.Receipts(cmd.Context(), segment)
				if err != nil {
					return err
				}
				for _, r := range rs.Receipts {
					fmt.Fprintln(g.out, r.Receipt)
				}
				return nil
			}
			return call(g, cmd, func(c *rpc.Client, ctx context.Context) (rpc.Receipts, error) {
				return c.Receipts(ctx, segment)
			}, func(w io.Writer, rs rpc.Receipts) {
				fmt.Fprintln(w, "SEGMENT\tREQUEST\tSHA256\tEVICTED")
				for _, r := range rs.Receipts {
					fmt.Fprintf(w, "%s\t%s\t%.16s…\t%s\n", r.Segment, r.Request, r.SHA256, r.EvictedAt.UTC().Format(time.RFC3339))
				}
			})
		},
	}
	c.Flags().StringVar(&segment, "segment", "", "only this segment's receipts")
	c.Flags().BoolVar(&lines, "json-lines", false, "print the receipts as a receipt file (one JSON line each)")
	return c
}

func takedownVerifyCmd(g *globals) *cobra.Command {
	var caFile string
	c := &cobra.Command{
		Use:   "verify FILE --ca ca.crt",
		Short: "Check a file of signed eviction receipts offline against the CA certificate",
		Long: "Check every receipt in FILE (JSON lines, as `edgectl takedown receipts --json-lines` writes them\n" +
			"and the relay exports them; - reads standard input) with nothing but the CA certificate(s) in --ca:\n" +
			"the signature, the node certificate's chain to the CA at the time of eviction, that the certificate\n" +
			"names the receipt's node and is a node certificate. Prints one line per receipt; exits 1 if any\n" +
			"receipt is refused or the file holds none. Needs no running edged.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if caFile == "" {
				return errors.New("--ca: the CA certificate file to verify against is required")
			}
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return err
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return fmt.Errorf("%s holds no PEM certificate", caFile)
			}
			var in io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			res, err := takedown.VerifyAll(in, roots, time.Now())
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			failed := 0
			for _, r := range res {
				if r.Err != nil {
					failed++
					fmt.Fprintf(tw, "line %d\tREFUSED\t%s\n", r.Line, oneLine(r.Err.Error()))
					continue
				}
				x := r.Receipt
				fmt.Fprintf(tw, "line %d\tok\trequest %s: node %s evicted %s (sha256 %s) at %s\n",
					r.Line, x.Request, x.Node, x.ContentID, x.SHA256, x.EvictedAt.UTC().Format(time.RFC3339Nano))
			}
			tw.Flush()
			switch {
			case err != nil:
				return fmt.Errorf("%s: %w", args[0], err)
			case len(res) == 0:
				return fmt.Errorf("%s holds no receipts", args[0])
			case failed > 0:
				return fmt.Errorf("%d of %d receipts refused", failed, len(res))
			}
			fmt.Fprintf(g.out, "%d receipts verified\n", len(res))
			return nil
		},
	}
	c.Flags().StringVar(&caFile, "ca", "", "CA certificate file (PEM; may hold several CAs)")
	return c
}
