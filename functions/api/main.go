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

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/env"
)

// VarRoutes names the variable selecting the route set.
const VarRoutes = "RELAY_API_ROUTES"

func main() { os.Exit(run(context.Background(), os.Getenv, os.Stdout, os.Stderr)) }

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	routes, err := api.ParseRouteSet(getenv(VarRoutes))
	if err != nil {
		fmt.Fprintf(stderr, "api: start: %s: %v\n", VarRoutes, err)
		return 1
	}
	d, err := env.Load(ctx, getenv, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "api: start:", err)
		return 1
	}
	// d.Relay carries the kicker, logger, clock and both stores (wired
	// once in lambda/env): enqueues take them from it. Routes that enqueue
	// kick fast (FAST_KICK): the operator route set is the ops function's,
	// whose role may not invoke the fire function.
	if routes != api.RoutesOperator {
		d.UseFastKick()
	}
	h := &api.Handler{Source: d.Source, Target: d.Target, Clock: d.Clock, Relay: d.Relay, Routes: routes, Logger: d.Logger}
	d.Logger.Info("api: serving", "routes", string(routes))
	lambda.StartWithOptions(h.Handle, lambda.WithContext(ctx))
	return 0
}
