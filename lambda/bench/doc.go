// Package bench measures what the serverless relay costs per delivered
// row, per plan: alarms, Lambda invocations, EventBridge Scheduler calls,
// DynamoDB requests and capacity units, and how many alarms a backlog
// spread over 4096 targets takes to drain against the design's bound
// ceil(4096 / (targets per fire × fires per alarm)) + 64 (DESIGN.md §5).
//
// It drives the real handlers (lambda/api, lambda/fire) in-process on
// DynamoDB tables in an in-process DynamoDB-API endpoint
// (infra/dynamotest) and a recording Scheduler endpoint
// (lambda/schedulertest), both through the real aws-sdk-go-v2 clients, and
// plays EventBridge Scheduler itself: each armed schedule "runs" at its
// at() time on a simulated clock by invoking the fire handler with the
// schedule's input. Every such run is one alarm and one Lambda invocation;
// every api request is one more. DynamoDB request counts and units come
// from infra/dynamo's Stats, which computes units from DynamoDB's
// published formulas because the test endpoint reports no consumed
// capacity.
//
// `make bench` runs it; docs/benchmarks.md and docs/deploy.md hold the
// figures. The package holds tests only.
package bench
