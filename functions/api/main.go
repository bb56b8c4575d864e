// Command api is the API Lambda function behind a function URL: enqueue
// rows and read delivery state (lambda/api).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/env"
	"github.com/relay-dev/relay/relaycore"
)

func main() { os.Exit(run(context.Background(), os.Getenv, os.Stdout, os.Stderr)) }

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	d, err := env.Load(ctx, getenv, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "api: start:", err)
		return 1
	}
	enq := relaycore.EnqueueConfig{Kicker: d.Kicker, TargetCaps: d.Target.Capabilities(), Logger: d.Logger}
	lambda.StartWithOptions((&api.Handler{Source: d.Source, Clock: d.Clock, Enqueue: enq, Logger: d.Logger}).Handle, lambda.WithContext(ctx))
	return 0
}
