package relaycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// maxEnqueueBody bounds what `relay enqueue` reads from stdin.
const maxEnqueueBody = 16 << 20

// enqueueCmd commits rows (the api function's JSON body format) to a source
// of an embedded relay's bbolt file.
func enqueueCmd(stdin io.Reader, stdout io.Writer) *cobra.Command {
	var dbPath, source string
	c := &cobra.Command{
		Use:   "enqueue --db FILE --source SOURCE < rows.json",
		Short: "Commit rows to a source's outbox (JSON body as the api function takes it)",
		Long: `enqueue reads {"rows":[{"target":"t","puts":[{"key":"k","value":"<base64>"}],"deletes":["k2"]}]}
from stdin, validates every row (nothing is written if one is invalid), commits them to the source's
outbox in the bbolt file, and prints the seq of each row. Run 'relay fire' to deliver them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needDB(dbPath); err != nil {
				return err
			}
			if source == "" {
				return errors.New("--source is required")
			}
			body, err := io.ReadAll(io.LimitReader(stdin, maxEnqueueBody+1))
			if err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			if len(body) > maxEnqueueBody {
				return fmt.Errorf("stdin: more than %d bytes", maxEnqueueBody)
			}
			rows, err := api.ParseRows(body, api.DefaultMaxRows)
			if err != nil {
				return err
			}
			stores, closeStores, err := openStores(cmd.Context(), "bolt", dbPath, dynamoOptions{})
			if err != nil {
				return err
			}
			defer closeStores()
			// No Kicker: the commit makes the source's durable alarm due
			// now, and `relay fire` runs it.
			h := &relaycore.RelayHandler{Source: stores.Source, Target: stores.Target}
			res, err := h.Enqueue(cmd.Context(), relaycore.Partition(source), rows, relaycore.EnqueueOptions{})
			if err != nil {
				return err
			}
			return json.NewEncoder(stdout).Encode(map[string]any{"source": source, "seqs": res.Seqs, "alarm_due_ms": res.AlarmDueMS})
		},
	}
	c.Flags().StringVar(&dbPath, "db", "", "bbolt file of an embedded relay (created if missing)")
	c.Flags().StringVar(&source, "source", "", "source id")
	return c
}

// fireCmd runs alarms for sources until their outboxes are empty or an
// alarm makes no progress (a target keeps failing): the embedded
// equivalent of the fire function.
func fireCmd(stdout io.Writer) *cobra.Command {
	var dbPath, plan string
	var maxAlarms int
	c := &cobra.Command{
		Use:   "fire --db FILE SOURCE...",
		Short: "Deliver a source's outbox now: run alarms until it is empty or stuck",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needDB(dbPath); err != nil {
				return err
			}
			budget, err := relaycore.PlanBudget(plan)
			if err != nil {
				return fmt.Errorf("--plan: %w", err)
			}
			stores, closeStores, err := openStores(cmd.Context(), "bolt", dbPath, dynamoOptions{})
			if err != nil {
				return err
			}
			defer closeStores()
			h := &relaycore.RelayHandler{Source: stores.Source, Target: stores.Target, Budget: budget}
			for _, a := range args {
				src := relaycore.Partition(a)
				var total relaycore.AlarmResult
				alarms := 0
				for ; alarms < maxAlarms; alarms++ {
					r, err := h.Alarm(cmd.Context(), src)
					if err != nil {
						return fmt.Errorf("fire %s: %w", a, err)
					}
					total.Fires += r.Fires
					total.RowsDelivered += r.RowsDelivered
					total.TargetsBlock += r.TargetsBlock
					if r.Cleared || r.Busy || r.RowsDelivered == 0 && r.RowsCleaned == 0 {
						total.Cleared, total.Busy = r.Cleared, r.Busy
						alarms++
						break
					}
				}
				fmt.Fprintf(stdout, "%s: %d alarms, %d fires, %d rows delivered, %d blocked-target events, outbox empty: %v\n",
					a, alarms, total.Fires, total.RowsDelivered, total.TargetsBlock, total.Cleared)
			}
			return nil
		},
	}
	c.Flags().StringVar(&dbPath, "db", "", "bbolt file of an embedded relay")
	c.Flags().StringVar(&plan, "plan", "free", "budget plan: free or paid")
	c.Flags().IntVar(&maxAlarms, "max-alarms", 1000, "stop after this many alarms per source")
	return c
}

func needDB(path string) error {
	if path == "" {
		return errors.New("--db is required")
	}
	return nil
}

// needExistingDB is needDB for the commands that only look at or operate
// on a relay: opening a missing file would create an empty relay.
func needExistingDB(path string) error {
	if err := needDB(path); err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	return nil
}

// stdinOr returns os.Stdin unless a reader was supplied (tests).
func stdinOr(r io.Reader) io.Reader {
	if r != nil {
		return r
	}
	return os.Stdin
}
