package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
)

// Prices is a published on-demand price list in US dollars per unit. The
// bill of a benchmark workload is its counted usage at these prices, so the
// dollars follow whatever the meter counts; only this table says what a
// unit costs.
type Prices struct {
	Region, Date string
	// DynamoDB on-demand, Standard table class: a write and a read request
	// unit.
	WriteUnit, ReadUnit float64
	// Lambda, arm64 (template.yaml's Architectures): a request, and a
	// GB-second of duration in the first pricing tier.
	LambdaRequest, LambdaGBSecond float64
	// EventBridge Scheduler: a scheduled invocation beyond the free tier.
	SchedulerInvocation float64
	// SQS FIFO: a request (each 64 KB chunk of a payload is one) in the
	// first tier.
	SQSFIFORequest float64
	// DynamoDB Streams: a GetRecords read request unit. Lambda event
	// source mappings read the stream at no charge, which is how the
	// Streams alternative is priced.
	StreamsReadUnit float64
}

// USEast1 is the price list every dollar figure in docs/benchmarks.md is
// computed with: us-east-1 (N. Virginia), on-demand, no free tier, no
// Savings Plans, as published on the date below. DynamoDB's on-demand
// throughput prices are the ones after the reduction of 1 November 2024
// (half the earlier $1.25 and $0.25 per million). docs/benchmarks.md ("The
// bill") names the pages they are read from; change them here and nowhere
// else.
var USEast1 = Prices{
	Region:              "us-east-1",
	Date:                "2026-12-02",
	WriteUnit:           0.625 / 1e6,
	ReadUnit:            0.125 / 1e6,
	LambdaRequest:       0.20 / 1e6,
	LambdaGBSecond:      0.0000133334,
	SchedulerInvocation: 1.00 / 1e6,
	SQSFIFORequest:      0.50 / 1e6,
	StreamsReadUnit:     0.02 / 1e5,
}

// lambdaMemoryMB is the functions' MemorySize in template.yaml
// (TestTemplatePricedAs keeps the two in step).
const lambdaMemoryMB = 256

// Usage is what a workload consumed of each priced item.
type Usage struct {
	WriteUnits, ReadUnits float64
	LambdaRequests        float64
	// LambdaMillis is the billed duration of all invocations, each rounded
	// up to the millisecond, at LambdaMemoryMB.
	LambdaMillis         float64
	LambdaMemoryMB       float64
	SchedulerInvocations float64
	SQSRequests          float64
	StreamsReadUnits     float64
}

// Bill is a usage priced: dollars per service and in total.
type Bill struct {
	DynamoDB, Lambda, Scheduler, SQS, Total float64
}

// Cost prices u. It is pure arithmetic: the test checks it on a
// hand-computed example.
func (p Prices) Cost(u Usage) Bill {
	gbSeconds := u.LambdaMillis / 1000 * u.LambdaMemoryMB / 1024
	b := Bill{
		DynamoDB:  u.WriteUnits*p.WriteUnit + u.ReadUnits*p.ReadUnit + u.StreamsReadUnits*p.StreamsReadUnit,
		Lambda:    u.LambdaRequests*p.LambdaRequest + gbSeconds*p.LambdaGBSecond,
		Scheduler: u.SchedulerInvocations * p.SchedulerInvocation,
		SQS:       u.SQSRequests * p.SQSFIFORequest,
	}
	b.Total = b.DynamoDB + b.Lambda + b.Scheduler + b.SQS
	return b
}

// PerMillionRows is the bill of u spread over rows delivered rows, scaled
// to a million rows.
func (p Prices) PerMillionRows(u Usage, rows float64) Bill {
	b := p.Cost(u)
	f := 1e6 / rows
	return Bill{DynamoDB: b.DynamoDB * f, Lambda: b.Lambda * f, Scheduler: b.Scheduler * f, SQS: b.SQS * f, Total: b.Total * f}
}

// FunctionDuration is a Lambda function's billed duration per invocation
// as a line: FixedMS plus PerRequestMS for each DynamoDB request the
// invocation makes (its other API calls, the runtime and its own CPU fold
// into the two). The fields before them say what the line was fitted to.
type FunctionDuration struct {
	Invocations    int     `json:"invocations"`
	DynamoRequests int     `json:"dynamo_requests"`
	BilledMS       int64   `json:"billed_ms"`
	FixedMS        float64 `json:"fixed_ms"`
	PerRequestMS   float64 `json:"per_request_ms"`
}

// Millis is the billed duration of invocations making requests DynamoDB
// requests in all.
func (f FunctionDuration) Millis(invocations, requests float64) float64 {
	return invocations*f.FixedMS + requests*f.PerRequestMS
}

// FitDuration fits a FunctionDuration to invocations, given as each one's
// billed milliseconds and DynamoDB requests, by least squares. A line that
// would start below zero, or invocations that all made the same number of
// requests, give a line through the origin (the time scales with the
// requests); one that would fall with more requests is flat at the mean.
func FitDuration(billedMS []int64, requests []int) FunctionDuration {
	f := FunctionDuration{Invocations: len(billedMS)}
	n := float64(len(billedMS))
	if n == 0 {
		return f
	}
	var sx, sy, sxx, sxy float64
	for i, y := range billedMS {
		x := float64(requests[i])
		f.BilledMS += y
		f.DynamoRequests += requests[i]
		sx, sy, sxx, sxy = sx+x, sy+float64(y), sxx+x*x, sxy+x*float64(y)
	}
	den := n*sxx - sx*sx
	if den > 0 {
		f.PerRequestMS = (n*sxy - sx*sy) / den
		f.FixedMS = (sy - f.PerRequestMS*sx) / n
	}
	switch {
	case (den <= 0 || f.FixedMS < 0) && sxx > 0:
		f.FixedMS, f.PerRequestMS = 0, sxy/sxx
	case den <= 0 || f.PerRequestMS < 0:
		f.FixedMS, f.PerRequestMS = sy/n, 0
	}
	return f
}

// LambdaDurations are the api and fire functions' durations: measured in
// the emulated deployment (lambda/bench's latency benchmark writes them
// with -lambda-durations, from the invocations of its cases at the
// template's settings), or assumed.
type LambdaDurations struct {
	MeasuredBy string           `json:"measured_by"`
	API        FunctionDuration `json:"api"`
	Fire       FunctionDuration `json:"fire"`
}

// DurationsFile is where the bill reads the measured durations, relative
// to this package's directory.
const DurationsFile = "testdata/lambda-durations.json"

// AssumedDurations is the fallback when no measurement is recorded: an
// invocation lasts as long as its requests in sequence, a DynamoDB
// request 8 ms and the one Scheduler request of each invocation (the
// enqueue's kick, the fire's re-arm) 30 ms. docs/benchmarks.md says which
// one the bill used.
var AssumedDurations = LambdaDurations{
	MeasuredBy: "assumed: 30 ms per invocation (one Scheduler request) + 8 ms per DynamoDB request",
	API:        FunctionDuration{FixedMS: 30, PerRequestMS: 8},
	Fire:       FunctionDuration{FixedMS: 30, PerRequestMS: 8},
}

// ReadDurations reads the measured durations at path; a missing file is
// the assumption, and a file that does not parse or fits nothing is an
// error.
func ReadDurations(path string) (LambdaDurations, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return AssumedDurations, nil
	}
	if err != nil {
		return LambdaDurations{}, err
	}
	var d LambdaDurations
	if err := json.Unmarshal(data, &d); err != nil {
		return LambdaDurations{}, fmt.Errorf("%s: %w", path, err)
	}
	if d.API.Invocations == 0 || d.Fire.Invocations == 0 || d.MeasuredBy == "" {
		return LambdaDurations{}, fmt.Errorf("%s: no api or fire invocations measured, or no measured_by", path)
	}
	return d, nil
}

// The alternatives, priced from request counts derived for the same rows
// (docs/benchmarks.md, "The bill", states and explains each):
//
//   - DynamoDB Streams + a Lambda consumer: the application puts each row
//     as an outbox item (≤ 1 KB, a standard write: 1 unit) whose TTL
//     deletes it later (TTL deletes are free); the stream is read by a
//     Lambda event source mapping (free) in batches of up to 100 records
//     (its default), and the consumer writes the rows' target items with
//     BatchWriteItem (≤ 1 KB items, 1 unit each, 25 per request).
//   - SQS FIFO + a Lambda consumer: the application sends rows with
//     SendMessageBatch (10 per request, one 64 KB chunk), Lambda's poller
//     receives them 10 at a time (the FIFO maximum) and deletes each batch
//     with DeleteMessageBatch: 3 requests per 10 rows; the consumer writes
//     the target items as above.
//
// A batch on the stream is the enqueue batch when enqueues are spread out
// (the interleaved workloads), else full. Empty receives of the idle SQS
// poller are per queue, not per row, and are left out.
const (
	streamsBatch   = 100
	sqsBatch       = 10
	batchWriteSize = 25
)

// consumerRequestMillis is a consumer's DynamoDB BatchWriteItem in the
// alternatives: the fallback's 8 ms per request, whatever the relay's
// durations were measured as (the consumers are not emulated).
const consumerRequestMillis = 8

func streamsUsage(rows, batch int) Usage {
	inv := math.Ceil(float64(rows) / float64(batch))
	perInv := math.Ceil(float64(batch)/batchWriteSize) * consumerRequestMillis
	return Usage{
		WriteUnits:     2 * float64(rows), // outbox put + target put
		LambdaRequests: inv,
		LambdaMillis:   inv * perInv,
		LambdaMemoryMB: lambdaMemoryMB,
	}
}

func sqsUsage(rows int) Usage {
	batches := math.Ceil(float64(rows) / sqsBatch)
	return Usage{
		WriteUnits:     float64(rows), // target put
		LambdaRequests: batches,
		LambdaMillis:   batches * math.Ceil(float64(sqsBatch)/batchWriteSize) * consumerRequestMillis,
		LambdaMemoryMB: lambdaMemoryMB,
		SQSRequests:    3 * batches, // send, receive, delete
	}
}
