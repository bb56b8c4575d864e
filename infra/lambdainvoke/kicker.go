package lambdainvoke

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/relay-dev/relay/relaycore"
)

// KickInput is the fast kick's event: the fire function's event as a
// schedule sends it ({"source":"<id>"}, infra/scheduler.FireInput), so the
// fire it starts is hop 0 of its own continuation chain.
type KickInput struct {
	Source string `json:"source"`
}

// KickerConfig wires a Kicker. Client, FunctionARN and Fallback are
// required.
type KickerConfig struct {
	// Client is the Lambda client; keep its retries short (one retry), the
	// fallback covers a refused invoke.
	Client API
	// FunctionARN is the fire function's ARN, the only function the
	// caller's role may invoke (template.yaml: the api function's FastKick
	// statement).
	FunctionARN string
	// Fallback takes kicks due later (back-off re-arms, a held row's retry,
	// a busy claim's lapse) and fast kicks Lambda refused or failed:
	// an *infra/scheduler.Kicker.
	Fallback relaycore.Kicker
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives refused fast kicks (each then went to Fallback); nil
	// discards.
	Logger *slog.Logger
	// InvokeTimeout bounds the async Invoke (default 1 s, a few times its
	// usual latency), so that an invoke that hangs leaves the fallback the
	// rest of the kick's time (the engine gives a kick 3 s).
	InvokeTimeout time.Duration
}

// DefaultInvokeTimeout is KickerConfig.InvokeTimeout's default.
const DefaultInvokeTimeout = time.Second

// KickerStats are a Kicker's counters since it was created.
type KickerStats struct {
	// Fast counts fires started by an async invoke Lambda accepted (202).
	Fast int64
	// Collapsed counts fast kicks for a (source, due) this Kicker had
	// already started: nothing sent.
	Collapsed int64
	// Later counts kicks due in the future, handed to Fallback.
	Later int64
	// Refused counts async invokes that failed or were refused; each went
	// to Fallback instead.
	Refused int64
	// FallbackFailures counts kicks Fallback failed too (the durable
	// alarm and the sweep still hold).
	FallbackFailures int64
}

// collapseMax bounds the remembered (source, due) pairs; past it the
// memory starts over (a forgotten pair costs one duplicate invoke, which
// the fire claim answers busy).
const collapseMax = 4096

// Kicker is the fast kick, a relaycore.Kicker for a producer's function
// (the api function, or a producer's own Lambda function embedding
// relaycore): a kick due now starts the fire at once with an asynchronous
// Invoke of the fire function (InvocationType Event, {"source":"<id>"});
// Lambda queues the event durably, retries it per the fire function's
// EventInvokeConfig and dead-letters it at last. A kick due later, and a
// fast kick Lambda refuses or that fails, goes to Fallback (Scheduler),
// whose one-time schedule runs at least five seconds later and up to a
// minute after its due second. The durable alarm and the sweep back both.
//
// Why not Scheduler for everything: Scheduler runs a schedule within the
// minute of its time (its precision), so a row written to a quiet source
// waited about 20 s at the median and up to a minute; an async invoke
// typically starts the fire within a fraction of a second.
//
// The engine kicks only when no wake-up is on its way
// (relaycore.KickDecision), and this Kicker collapses repeated kicks for
// one (source, due) it already started, as Scheduler collapses schedule
// names; a duplicate that gets through costs one invocation that finds the
// claim and steps aside as busy. Safe for concurrent use.
type Kicker struct {
	cfg KickerConfig

	mu      sync.Mutex
	started map[relaycore.Partition]int64 // due of the last fire started per source

	fast, collapsed, later, refused, fallbackFailures atomic.Int64
}

var _ relaycore.Kicker = (*Kicker)(nil)

// NewKicker checks cfg and returns a Kicker.
func NewKicker(cfg KickerConfig) (*Kicker, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("new fast kicker: nil lambda client")
	case cfg.FunctionARN == "":
		return nil, errors.New("new fast kicker: empty function arn")
	case cfg.Fallback == nil:
		return nil, errors.New("new fast kicker: nil fallback kicker")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.InvokeTimeout <= 0 {
		cfg.InvokeTimeout = DefaultInvokeTimeout
	}
	return &Kicker{cfg: cfg, started: map[relaycore.Partition]int64{}}, nil
}

// Kick starts source's fire now when dueMS is due, and hands it to
// Fallback otherwise or when the invoke fails. A nil error means the fire
// was queued by Lambda or armed by Fallback; an error means neither
// (callers log it and rely on the durable alarm and the sweep).
func (k *Kicker) Kick(ctx context.Context, source relaycore.Partition, dueMS int64) error {
	if source == "" {
		return fmt.Errorf("kick: %w: empty", ErrInvalidSource)
	}
	if dueMS > k.cfg.Now().UnixMilli() {
		// Firing before the due time would find nothing due.
		k.later.Add(1)
		return k.fallback(ctx, source, dueMS, nil)
	}
	k.mu.Lock()
	if due, ok := k.started[source]; ok && due == dueMS {
		k.mu.Unlock()
		k.collapsed.Add(1)
		return nil
	}
	k.mu.Unlock()
	if err := k.invoke(ctx, source); err != nil {
		k.refused.Add(1)
		k.cfg.Logger.Warn("relay fast kick refused; kicking through the scheduler instead", "source", string(source), "due_ms", dueMS, "err", err)
		return k.fallback(ctx, source, dueMS, err)
	}
	k.fast.Add(1)
	k.mu.Lock()
	if len(k.started) >= collapseMax {
		clear(k.started)
	}
	k.started[source] = dueMS
	k.mu.Unlock()
	return nil
}

func (k *Kicker) invoke(ctx context.Context, source relaycore.Partition) error {
	payload, err := json.Marshal(KickInput{Source: string(source)})
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.InvokeTimeout)
	defer cancel()
	out, err := k.cfg.Client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(k.cfg.FunctionARN),
		InvocationType: types.InvocationTypeEvent,
		Payload:        payload,
	})
	if err != nil {
		return fmt.Errorf("invoke %s: %w", k.cfg.FunctionARN, err)
	}
	if out.StatusCode != http.StatusAccepted {
		return fmt.Errorf("invoke %s: status %d: %w", k.cfg.FunctionARN, out.StatusCode, ErrNotAccepted)
	}
	return nil
}

// fallback kicks through Fallback; invokeErr, when set, is the fast kick's
// failure, joined to Fallback's so a log line tells both.
func (k *Kicker) fallback(ctx context.Context, source relaycore.Partition, dueMS int64, invokeErr error) error {
	err := k.cfg.Fallback.Kick(ctx, source, dueMS)
	if err != nil {
		k.fallbackFailures.Add(1)
		if invokeErr != nil {
			return fmt.Errorf("fast kick %s: %w; fallback: %w", source, invokeErr, err)
		}
		return err
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (k *Kicker) Stats() KickerStats {
	return KickerStats{
		Fast: k.fast.Load(), Collapsed: k.collapsed.Load(), Later: k.later.Load(),
		Refused: k.refused.Load(), FallbackFailures: k.fallbackFailures.Load(),
	}
}
