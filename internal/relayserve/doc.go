// Package relayserve is `relay serve`: the embedded relay as a
// self-hosted server. One process on one store (a bbolt file, targets in
// the same file or another; PostgreSQL, infra/postgres; or two DynamoDB
// tables, infra/dynamo: store.go and storedb.go open what the
// configuration names) serves the HTTP API of lambda/api, runs the in-process
// alarm clock and sweeper (infra/alarmclock) with the configured budget,
// and exports Prometheus metrics carrying the Lambda functions' EMF
// signals.
//
// The API is the Lambda function URL's: each net/http request becomes an
// api.Request and api.Handler.Serve answers it, so the two hosts share one
// implementation. What the function URL's IAM auth does in the cloud is
// done here before the handler runs: callers authenticate with a client
// certificate (edge/pki identities, verified against tls.client_ca) or a
// bearer token (stored as a SHA-256 digest, see tokens.go), and roles
// (produce to listed sources, read, operate) map onto the handler's route
// sets. Anonymous access exists only when configured, and only on a
// loopback listener.
//
// Shutdown is a drain: stop accepting, let in-flight requests and fires
// finish within drain_timeout, close the store. A fire cut short by the
// deadline (or by kill -9) leaves its claim to lapse and its durable
// alarm record for the sweep after the next start: acknowledged rows are
// committed to the store before the client hears of them, and the targets'
// rh watermarks make redelivery idempotent.
//
// SIGHUP (Options.Reload) re-reads the configuration file and applies
// what is read per request, principals and auth, together with the
// credential files' current content, all or nothing (reload.go). The
// rest of the configuration is read once at start: a reload that finds
// another key changed is refused and names it.
//
// docs/serve.md is the reference for the configuration, auth, metrics and
// operations.
package relayserve
