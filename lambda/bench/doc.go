// Package bench measures what the serverless relay costs per delivered
// row, per plan: alarms, Lambda invocations, EventBridge Scheduler calls,
// DynamoDB requests and capacity units, how many alarms a backlog spread
// over 4096 targets takes to drain against the design's bound
// ceil(4096 / (targets per fire × fires per alarm)) + 64 (docs/engine.md, "Budgets"),
// and how long the drain takes on a simulated clock, without and with the
// fire function's self-continuation (lambda/fire).
//
// It drives the real handlers (lambda/api, lambda/fire) in-process on
// DynamoDB tables in an in-process DynamoDB-API endpoint
// (infra/dynamotest), a recording Scheduler endpoint
// (infra/scheduler/schedulertest) and a recording Lambda endpoint
// (infra/lambdainvoke/invoketest), all through the real aws-sdk-go-v2
// clients, and plays EventBridge Scheduler and Lambda's async
// queue itself: each armed schedule "runs" at its at() time, and each
// accepted continuation shortly after the invocation that sent it, by
// invoking the fire handler with the event. Simulated time follows a stated
// latency model (a DynamoDB request 8 ms, a Scheduler or Lambda request
// 30 ms, an async launch 100 ms): an invocation lasts as long as its
// requests. One source runs one alarm at a time; an invocation that
// arrives while another alarm runs is counted as busy, as the engine's
// claim would make it. Scheduler runs schedules exactly on time here,
// while the real service may be late, so the drain times are lower bounds
// and the gap between the two settings is what continuation saves.
//
// DynamoDB request counts and units come from infra/dynamo's Stats, which
// computes units from DynamoDB's published formulas because the test
// endpoint reports no consumed capacity.
//
// BenchmarkLatency (latency_test.go) measures enqueue-to-apply lag and
// drain time instead, on the emulated deployment of lambda/emudeploy: the
// real bootstraps under the runtime emulator on wall time, with the
// Scheduler-only kick and the fast kick side by side; TestLatencyModel runs
// the same cases in process on virtual time (testing/synctest), a
// discrete-event model whose figures do not depend on the machine
// (RELAY_LATENCY_FULL=1: issue 25's full sizes, which make bench runs in
// the model). Both time every api and fire invocation and, with
// -lambda-durations FILE, write the billed duration fitted to them
// (bench.LambdaDurations), which the bill (bench) prices Lambda
// GB-seconds from: bench/testdata/lambda-durations.json.
//
// `make bench` runs both; docs/benchmarks.md and docs/deploy.md hold the
// figures. The package holds tests only.
package bench
