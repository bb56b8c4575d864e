package sim_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore/sim"
)

// postgresOpener runs on the test binary's throwaway PostgreSQL cluster
// (infra/postgres/pgtest, started on first use; without PostgreSQL
// installed the postgres run skips, or fails with RELAY_REQUIRE_POSTGRES=1).
// Each run gets two fresh stores on one shared database, a source and a
// target store with the scenario's limits, whose items are deleted when
// the run ends.
func postgresOpener(t *testing.T) opener {
	pool := pgtest.SharedDatabase(t)
	db, err := postgres.Open(t.Context(), pool, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	o := postgres.DefaultCapabilities
	return func(sc *sim.Scenario) (sim.Stores, func(), error) {
		id := n.Add(1)
		src := db.Store(fmt.Sprintf("sim-%d-%d-source", sc.Seed, id)).WithCapabilities(sc.SourceLimits.Caps(o))
		tgt := db.Store(fmt.Sprintf("sim-%d-%d-target", sc.Seed, id)).WithCapabilities(sc.TargetLimits.Caps(o))
		release := func() {
			_, err := pool.Exec(context.Background(), `DELETE FROM relay_items WHERE store = $1 OR store = $2`, src.Name(), tgt.Name())
			if err != nil {
				t.Errorf("seed %d: delete the run's items: %v", sc.Seed, err)
			}
		}
		return sim.Stores{Source: src, Target: tgt}, release, nil
	}
}
