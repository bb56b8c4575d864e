package takedowns

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Owner serves the takedown calls and runs the owner's passes (Run). It
// holds no state between calls: every fact is in the stores, so any number
// of Owners (relay serve replicas, concurrent Lambda invocations) may run
// at once; each write is an idempotent enqueue, so two of them doing the
// same step write it once.
type Owner struct {
	// Relay enqueues the package's rows and holds both stores (Source,
	// Target) and the clock. Required. Its Hook must include Hook.
	Relay *relaycore.RelayHandler
	// Roots are the CA certificates node receipts must chain to (relay
	// serve: tls.client_ca or takedowns.ca; Lambda: a parameter). Nil:
	// every receipt is refused with ErrNoCA.
	Roots *x509.CertPool
	// Logger receives the audit lines (requests, waivers, receipts,
	// orders, overdue holders); nil discards.
	Logger *slog.Logger
	// CloseAfter is how long a complete takedown stays watched after its
	// last receipt or waiver: for late holders (a node that reports the
	// content again) and in every pass's cost. Then the owner takes it off
	// the open list; its status and receipts stay readable. Zero:
	// DefaultCloseAfter; negative: never.
	CloseAfter time.Duration
}

// DefaultCloseAfter is Owner.CloseAfter's default.
const DefaultCloseAfter = 30 * 24 * time.Hour

// Errors of the Owner's calls. Each refusal changes nothing.
var (
	// ErrInvalid: a malformed argument (a report, a content id, a reason).
	ErrInvalid = errors.New("invalid takedown input")
	// ErrRefused: a receipt that does not prove what it must (the message
	// says which check failed).
	ErrRefused = errors.New("receipt refused")
	// ErrNotFound: no takedown has that id.
	ErrNotFound = errors.New("unknown takedown")
	// ErrNotYet: the takedown is committed and its record still on its way
	// to its partition (the relay delivers it in a moment): retry.
	ErrNotYet = errors.New("takedown not delivered yet")
	// ErrNotHolder: a waiver for a node the takedown does not expect.
	ErrNotHolder = errors.New("not a holder of this takedown")
	// ErrWaived: the holder was waived already.
	ErrWaived = errors.New("holder already waived")
	// ErrNoCA: no CA is configured to check receipts against.
	ErrNoCA = errors.New("no takedown CA configured: receipts cannot be verified")
)

func (o *Owner) now() time.Time {
	if o.Relay.Clock == nil {
		return time.Now()
	}
	return o.Relay.Clock.Now()
}

func (o *Owner) log() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// idemKey maps any caller-chosen or derived key to a relaycore
// idempotency key: kind, ':' and the SHA-256 of the parts (the contract's
// keys may hold '/', which relaycore's may not).
func idemKey(kind string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return kind + ":" + hex.EncodeToString(h.Sum(nil))
}

// enqueue commits rows through the control source (or src) as one
// idempotent batch under key.
func (o *Owner) enqueue(ctx context.Context, src relaycore.Partition, key string, rows []relaycore.Row) (relaycore.CommitResult, error) {
	return o.Relay.Enqueue(ctx, src, rows, relaycore.EnqueueOptions{IdempotencyKey: key})
}

// readAll reads every application key of target with prefix.
func (o *Owner) readAll(ctx context.Context, target relaycore.Partition, prefix string) ([]relaycore.KV, error) {
	var out []relaycore.KV
	req := relaycore.TargetReadRequest{Prefix: prefix, Limit: 1000}
	for {
		pg, err := relaycore.ReadTarget(ctx, o.Relay.Target, target, req)
		if err != nil {
			return nil, err
		}
		out = append(out, pg.Items...)
		if pg.Next == "" {
			return out, nil
		}
		req.After = pg.Next
	}
}

// caughtUp reports whether the control source has delivered every row it
// took for target: the owner decides from a partition only then, so a
// step it enqueued is never taken again for not being visible yet.
func (o *Owner) caughtUp(ctx context.Context, target relaycore.Partition) (bool, error) {
	st, err := relaycore.GetTarget(ctx, o.Relay.Source, ControlSource, target)
	if errors.Is(err, relaycore.ErrUnknownTarget) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return st.Pending == 0, nil
}
