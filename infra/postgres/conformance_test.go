package postgres_test

import (
	"testing"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/storetest"
)

// TestConformance runs the shared storage-contract suite on a real
// PostgreSQL server, each subtest on a store of its own.
func TestConformance(t *testing.T) {
	db := sharedDB(t)
	storetest.Run(t, func(t *testing.T) relaycore.Store { return freshStore(t, db) })
}

// TestConformanceSmallLimits runs the suite with DynamoDB-sized limits, so
// the limit tests follow the store's reported capabilities.
func TestConformanceSmallLimits(t *testing.T) {
	db := sharedDB(t)
	caps := relaycore.Capabilities{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10, ItemOverhead: 32}
	storetest.Run(t, func(t *testing.T) relaycore.Store { return freshStore(t, db).WithCapabilities(caps) })
}
