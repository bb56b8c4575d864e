package scheduler_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The SDK client keeps HTTP connections; every test server is closed in
// t.Cleanup, so nothing may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
