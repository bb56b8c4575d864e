package sim_test

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore/sim"
)

func memOpener(*testing.T) opener {
	o := mem.DefaultCapabilities
	return func(sc *sim.Scenario) (sim.Stores, func(), error) {
		return sim.Stores{Source: mem.New(sc.SourceLimits.Caps(o)), Target: mem.New(sc.TargetLimits.Caps(o))}, func() {}, nil
	}
}

// boltOpener opens real bbolt files in the test's temp dir: one for the
// sources and one for the targets (their limits differ, and limits are per
// file). NoSync: the simulation checks the engine's logic, not the disk;
// infra/bolt's own tests cover durability. Each run's files are checked
// with bbolt's consistency check and removed when the run ends.
func boltOpener(t *testing.T) opener {
	dir := t.TempDir()
	var n atomic.Int64
	o := bolt.DefaultCapabilities
	return func(sc *sim.Scenario) (sim.Stores, func(), error) {
		base := filepath.Join(dir, fmt.Sprintf("seed-%d-%d", sc.Seed, n.Add(1)))
		src, err := bolt.Open(base+".source.db", bolt.Options{Capabilities: sc.SourceLimits.Caps(o), NoSync: true})
		if err != nil {
			return sim.Stores{}, nil, err
		}
		tgt, err := bolt.Open(base+".target.db", bolt.Options{Capabilities: sc.TargetLimits.Caps(o), NoSync: true})
		if err != nil {
			_ = src.Close()
			return sim.Stores{}, nil, err
		}
		release := func() {
			for _, db := range []*bolt.DB{src, tgt} {
				if err := db.Check(); err != nil {
					t.Errorf("seed %d: %v", sc.Seed, err)
				}
				if err := db.Close(); err != nil {
					t.Errorf("seed %d: %v", sc.Seed, err)
				}
			}
		}
		return sim.Stores{Source: src.Store("relay"), Target: tgt.Store("relay")}, release, nil
	}
}
