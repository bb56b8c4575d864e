package storetest

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// SeedEnv names the environment variable that fixes the seed of the
// randomised subtests, to replay a failure.
const SeedEnv = "STORETEST_SEED"

// seedFor returns the seed for one randomised subtest and logs it, so a
// failing run can be replayed with STORETEST_SEED=<seed>.
func seedFor(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(SeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, v, err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	return seed
}
