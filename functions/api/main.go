// Command api is the API Lambda function behind a function URL
// (lambda/api). RELAY_API_ROUTES selects its routes: producer (default:
// enqueue and reads), operator (reads and operator actions) or all; any
// other value stops the function at start-up.
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
		fmt.Fprintln(stderr, "api: start:", err)
		return 1
	}
	// The handler and its kicker are wired in lambda/env, which the
	// emulated deployment (lambda/emudeploy) runs too.
	h, err := d.APIHandler(getenv)
	if err != nil {
		fmt.Fprintln(stderr, "api: start:", err)
		return 1
	}
	lambda.StartWithOptions(event.Invoker(h.Handle), lambda.WithContext(ctx))
	return 0
}
