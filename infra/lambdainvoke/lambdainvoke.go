// Package lambdainvoke starts and continues relay fires without waiting
// for EventBridge Scheduler: it invokes the fire function asynchronously
// (Lambda Invoke with InvocationType Event). Kicker is the fast kick a
// producer's function uses after an enqueue ({"source":"<id>"}, falling
// back to Scheduler); Invoker continues a draining source from the fire
// function itself ({"source":"<id>","hop":N}).
//
// Why: a one-time Scheduler schedule is sent at least five seconds ahead
// (infra/scheduler.DefaultMinLead) and may run up to a minute late, so a
// source whose backlog needs hundreds of alarms would take tens of minutes
// to drain if every alarm waited for Scheduler. An async invoke is queued
// by Lambda and typically runs within milliseconds.
//
// Continuations are a fast path only. The engine still re-arms the durable
// alarm and kicks Scheduler after every alarm, and the sweep still fires
// overdue alarms, so a lost, throttled or refused invoke delays a source
// but never strands it. The fire function bounds the chain (lambda/fire:
// hop counter), and Lambda's own recursive-loop detection stops a chain of
// about 16 invocations, which is why that bound stays below it.
package lambdainvoke

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/relay-dev/relay/relaycore"
)

// API is the part of the Lambda client the Invoker uses; *lambda.Client
// implements it.
type API interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// ErrInvalidSource means Continue was called with an empty source; nothing
// was sent.
var ErrInvalidSource = errors.New("invalid source partition")

// ErrNotAccepted means Lambda answered an asynchronous invoke with a
// status other than 202 Accepted, so the event may not be queued.
var ErrNotAccepted = errors.New("async invoke not accepted")

// Config wires an Invoker. Both fields are required.
type Config struct {
	// Client is the Lambda client. Keep its retries short: a continuation
	// is best effort and the Scheduler kick already covers the source.
	Client API
	// FunctionARN is the fire function's ARN. IAM grants the fire function
	// lambda:InvokeFunction on exactly this ARN (template.yaml).
	FunctionARN string
}

// Input is the continuation event: the fire function's event
// (infra/scheduler.FireInput) plus the hop counter of the chain. Hop is at
// least 1: the invocation that a schedule, the sweep or an operator starts
// is hop 0 and sends no hop field.
type Input struct {
	Source string `json:"source"`
	Hop    int    `json:"hop"`
}

// Stats are an Invoker's counters since it was created.
type Stats struct {
	// Calls counts Continue calls that reached the Lambda API.
	Calls int64
	// Accepted counts invokes Lambda queued (202).
	Accepted int64
	// Failures counts Continue calls that returned an error.
	Failures int64
}

// Invoker sends continuation events to the fire function. It is safe for
// concurrent use.
type Invoker struct {
	cfg                       Config
	calls, accepted, failures atomic.Int64
}

// New checks cfg and returns an Invoker.
func New(cfg Config) (*Invoker, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("new invoker: nil lambda client")
	case cfg.FunctionARN == "":
		return nil, errors.New("new invoker: empty function arn")
	}
	return &Invoker{cfg: cfg}, nil
}

// Continue asks Lambda to run the fire function once more for source, as
// hop hop (≥ 1) of the current chain. Lambda queues the event and answers
// 202 before the function runs; a nil error means it was queued, not that
// it ran.
//
// Not idempotent at the Lambda level: a retry after an ambiguous failure
// (a timeout after Lambda queued the event) may queue the continuation
// twice. That is harmless: the second fire finds the first one's claim and
// steps aside as busy, and a busy fire never continues, so duplicates do
// not multiply. Callers log and count errors; the durable alarm, its
// Scheduler kick and the sweep still cover the source.
func (v *Invoker) Continue(ctx context.Context, source relaycore.Partition, hop int) error {
	if source == "" {
		v.failures.Add(1)
		return fmt.Errorf("continue: %w: empty", ErrInvalidSource)
	}
	if hop < 1 {
		v.failures.Add(1)
		return fmt.Errorf("continue %s: hop %d, want at least 1", source, hop)
	}
	payload, err := json.Marshal(Input{Source: string(source), Hop: hop})
	if err != nil {
		v.failures.Add(1)
		return fmt.Errorf("continue %s: encode event: %w", source, err)
	}
	v.calls.Add(1)
	out, err := v.cfg.Client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(v.cfg.FunctionARN),
		InvocationType: types.InvocationTypeEvent,
		Payload:        payload,
	})
	if err != nil {
		v.failures.Add(1)
		return fmt.Errorf("continue %s: invoke %s: %w", source, v.cfg.FunctionARN, err)
	}
	if out.StatusCode != http.StatusAccepted {
		v.failures.Add(1)
		return fmt.Errorf("continue %s: invoke %s: status %d: %w", source, v.cfg.FunctionARN, out.StatusCode, ErrNotAccepted)
	}
	v.accepted.Add(1)
	return nil
}

// Stats returns a snapshot of the counters.
func (v *Invoker) Stats() Stats {
	return Stats{Calls: v.calls.Load(), Accepted: v.accepted.Load(), Failures: v.failures.Load()}
}
