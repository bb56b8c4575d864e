// Command sweep is the sweep Lambda function: every minute, fire or
// re-kick overdue durable alarms (lambda/sweep).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/relay-dev/relay/lambda/env"
	"github.com/relay-dev/relay/lambda/sweep"
)

func main() { os.Exit(run(context.Background(), os.Getenv, os.Stdout, os.Stderr)) }

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	d, err := env.Load(ctx, getenv, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "sweep: start:", err)
		return 1
	}
	h := &sweep.Handler{Relay: d.Relay, Index: d.Source, Source: d.Source, Kicker: d.Kicker, Clock: d.Clock, Logger: d.Logger, Metrics: d.Metrics}
	lambda.StartWithOptions(h.Handle, lambda.WithContext(ctx))
	return 0
}
