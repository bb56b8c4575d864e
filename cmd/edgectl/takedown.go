package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/edge/takedown"
)

func takedownCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "takedown",
		Short: "Evict segments for takedown requests; list and verify signed eviction receipts",
	}
	cmd.AddCommand(takedownVerifyCmd(g))
	return cmd
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
