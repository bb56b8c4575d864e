// Command relay is the local runner and operator CLI of the cloud relay:
// `relay demo` runs the embedded relay on a realistic workload; `relay
// status` inspects a source's outbox; `relay targets`, `relay target` and
// `relay archive` see and fix stuck targets on a bbolt file, DynamoDB
// tables or a running `relay serve` (--url; docs/operations.md); `relay
// serve` is the self-hosted server (docs/serve.md). See `relay --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/relay-dev/relay/internal/relaycli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := relaycli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
