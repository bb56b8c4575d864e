// Package rietest runs the relay's Lambda functions the way `sam local
// invoke` and the Lambda service do: each function's bootstrap is built
// natively (CGO_ENABLED=0, -tags lambda.norpc) and run under the AWS Lambda
// Runtime Interface Emulator (aws-lambda-rie) on 127.0.0.1, and invoked
// over HTTP with the repository's events/*.json and env.json. DynamoDB is
// an in-process DynamoDB-API endpoint (infra/dynamotest) and EventBridge
// Scheduler a recording endpoint (infra/scheduler/schedulertest), both
// reached by the bootstraps through the real aws-sdk-go-v2 clients.
//
// The emulator comes from RELAY_RIE (`make test` sets it to the pinned
// binary `make tools` installs); without it the tests `go install` the
// version pinned in the Makefile into a temporary GOBIN, and skip only
// when that fails for lack of network.
//
// The package holds tests only.
package rietest
