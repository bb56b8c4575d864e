// Command edgectl operates a running edged through its local RPC: status,
// index, ledger and deadletter views, operator retry and purge, segment
// ingest, per-segment assurance, and a development PKI (`edgectl pki`).
// See docs/edge.md and `edgectl --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
