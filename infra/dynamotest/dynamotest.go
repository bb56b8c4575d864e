// Package dynamotest gives tests an in-process DynamoDB-API endpoint
// (infra/dynamoemu: minidyn behind a net/http server on 127.0.0.1, with
// the fixes listed on dynamoemu.Endpoint) that lives as long as the test.
package dynamotest

import (
	"testing"

	"github.com/relay-dev/relay/infra/dynamoemu"
)

// EndpointEnv names the environment variable that points tests at another
// DynamoDB-API endpoint (real DynamoDB, DynamoDB Local) instead of the
// in-process one. Only tests read it.
const EndpointEnv = "RELAY_DYNAMODB_ENDPOINT"

// Start runs an endpoint until the test ends.
func Start(tb testing.TB) *dynamoemu.Endpoint {
	tb.Helper()
	e, err := dynamoemu.New()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}
