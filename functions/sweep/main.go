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
	"github.com/relay-dev/relay/lambda/event"
)

func main() { os.Exit(run(context.Background(), os.Getenv, os.Stdout, os.Stderr)) }

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	d, err := env.Load(ctx, getenv, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "sweep: start:", err)
		return 1
	}
	h := d.SweepHandler() // wired in lambda/env, as lambda/emudeploy runs it
	lambda.StartWithOptions(event.Invoker(h.Handle), lambda.WithContext(ctx))
	return 0
}
