// Package emudeploy is the serverless relay deployed on one machine, for
// benchmarks that measure latency on wall time: the real bootstraps of the
// api, fire and sweep functions (built as sam.mk builds them) under the
// AWS Lambda Runtime Interface Emulator, reaching DynamoDB, EventBridge
// Scheduler and Lambda through the real aws-sdk-go-v2 clients at
// endpoints on 127.0.0.1 that behave, in time, as the services document:
//
//   - DynamoDB: the in-process DynamoDB-API endpoint (infra/dynamoemu)
//     behind a front that holds each request for a single-digit
//     millisecond latency (DefaultDynamoLatency: 2 to 8 ms), so a fire
//     that delivers its targets one after another pays them in sequence
//     and a concurrent one overlaps them. The front also records when each
//     target key was first written, which is a row's apply time.
//   - Scheduler: CreateSchedule arms a one-time schedule that runs at a
//     uniformly random whole second of the 60 s window from its at() time
//     (RunAt; Scheduler's documented 60-second precision), then frees its
//     name. Its run is an asynchronous invoke of the fire function.
//   - Lambda: each function has a fixed pool of execution environments
//     (the fire function's is its reserved concurrency) and, for
//     asynchronous invokes, a queue in front of it (Async): a queue delay
//     (DefaultQueueDelay: 50 to 150 ms), throttling with Lambda's
//     documented retry intervals when every environment is busy, retries
//     of function errors, the maximum event age. An Invoke endpoint per
//     calling function accepts its async invokes of the fire function and
//     can refuse them all (Deployment.RefuseKicks).
//   - The sweep: a rate(1 minute) schedule from a seeded phase (Sweep).
//   - The Scheduler and Lambda API calls themselves: DefaultAPILatency.
//
// Every invocation is timed (Invocation: its duration and the DynamoDB
// requests it made, counted per execution environment by the access key
// it signs with), which is what the bill (bench) prices Lambda duration
// from. With Config.PruneApplied the DynamoDB front deletes each applied
// row's target item, so the emulator, whose cost per request grows with
// the table, stays fast through long runs.
//
// Every modelled delay is drawn from a seeded generator; the model is
// tested on a manual clock (precision, queue delay, the concurrency limit,
// retries), so a benchmark on it measures the relay, not the emulator.
// What the model leaves out: cold starts beyond the bootstrap's own init
// under the emulator, Lambda's scaling ramp, DynamoDB throttling, and any
// time the machine itself adds (2 shared cores: a figure here is an upper
// bound on what the code costs, plus the modelled service times).
//
// With Config.InProcess the same deployment runs without processes or
// sockets: each function wired by lambda/env from the same variables and
// its handler called directly, every endpoint behind an in-memory
// transport. Inside a testing/synctest bubble every modelled delay is then
// a timer on virtual time: a discrete-event model of the deployment whose
// figures do not depend on the machine (lambda/bench's TestLatencyModel).
//
// docs/benchmarks.md ("Serverless relay: latency") lists the model with
// its sources and the figures lambda/bench measures on it. No binary links
// this package (deploy's TestDeps).
package emudeploy
