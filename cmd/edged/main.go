// Command edged is the edge agent: it accepts content segments from its
// configured peers over mutual TLS, stores them atomically and relays them
// onward with a persistent ledger. See docs/edge.md.
//
//	edged -config /etc/edged/edged.yaml
//	edged -check-config -config /etc/edged/edged.yaml
//
// SIGHUP reloads the certificate files; SIGINT and SIGTERM stop gracefully.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/relay-dev/relay/edge/daemon"
	"github.com/relay-dev/relay/internal/buildversion"
)

// version overrides the version read from the build info when set at
// build time: -ldflags "-X main.version=v1.2.3".
var version = ""

func main() {
	if version == "" {
		version = buildversion.String()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := daemon.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, hup, version)
	stop()
	os.Exit(code)
}
