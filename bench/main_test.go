package bench

import (
	"os"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

// TestMain stops the PostgreSQL test cluster the PostgreSQL benchmarks
// start, if one did.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
