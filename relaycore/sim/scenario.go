package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Limits are the batch limits a scenario asks its stores to enforce. The
// stores keep their own item accounting (ItemOverhead must not under-count).
type Limits struct {
	MaxBatchItems, MaxBatchBytes, MaxItemBytes int
}

// Caps returns base (a store's own capabilities, which keep its item
// accounting) with l's limits.
func (l Limits) Caps(base relaycore.Capabilities) relaycore.Capabilities {
	base.MaxBatchItems, base.MaxBatchBytes, base.MaxItemBytes = l.MaxBatchItems, l.MaxBatchBytes, l.MaxItemBytes
	return base
}

// failKind is how a target misbehaves.
type failKind int

const (
	healthy   failKind = iota
	transient          // each call fails with probability per100
	outage             // every call fails from step from until step heal (heal < 0: never)
)

type failure struct {
	kind   failKind
	per100 int
	from   int
	heal   int // store call at which it heals; -1: never (a permanently failing target)
}

// outageSpan places outages: they start within the first outageSpan store
// calls and last up to outageSpan calls.
const outageSpan = 400

// keySpec is one user key of a target. Owner is the only source that may
// put it with varying values or delete it; "" marks a shared key that any
// source may put, always with the same value, and nobody deletes.
type keySpec struct {
	Key   string
	Owner relaycore.Partition
}

// batchPlan is one Enqueue call of a writer.
type batchPlan struct {
	rows       []relaycore.Row
	sleepMS    int64 // sleep before the call
	deadlineMS int64 // caller deadline relative to its clock (0: none)
}

// writerPlan is what one writer (and, after a crash, its replacements) commits.
type writerPlan struct {
	name    string
	source  relaycore.Partition
	lease   bool // a lease holder of the lease-required source
	batches []batchPlan
	next    int // index of the next batch; survives a crash (the plan is the workload, not memory)
}

// Scenario is everything a seed decides before the run starts.
type Scenario struct {
	Seed        uint64
	Sources     []relaycore.Partition
	Targets     []relaycore.Partition
	LeaseSource relaycore.Partition // "" when no source is lease-required

	keys     map[relaycore.Partition][]keySpec
	failures map[relaycore.Partition]failure
	writers  []*writerPlan
	hookObs  map[relaycore.Partition][]relaycore.KV

	// Bulk scenarios (about one in three) commit large incompressible
	// values against source limits that hold only a few pages beside the
	// room a checkpoint keeps for rs, target limits that take a row or two
	// per batch, and long target names (so a blocked set makes rs large):
	// fires then rewrite several partly delivered pages in checkpoints near
	// the source's batch-byte limit.
	Bulk bool
	// Wide scenarios (about one in ten of the others) give the first
	// source more targets in an outage than the blocked set holds
	// (MaxBlockedTargets + 2..9, a row each, committed first), with 3, 5
	// or 7 targets per fire, which do not divide it: fires fill the set
	// and hold the rest, and the checker holds the set to its bound.
	Wide bool
	// Loose scenarios (half of them) give fires a source store that is a
	// relaycore.LooseDeleter: finished pages leave through rs.gone and are
	// deleted after the checkpoint, faults and crashes included.
	Loose bool

	SourceLimits, TargetLimits Limits
	PageBytes                  int
	Budget                     relaycore.RelayBudget
	ClaimTTL, BackoffMax       time.Duration
	LeaseTTL, SkewMargin       time.Duration
	maxSkewMS                  int64
	crashPer1000               int
	ambiguousPer1000           int
	kickLossPer100             int
	kickDupPer100              int
	firePer1000                int // direct overlapping fires per store call
	maxFiresPerSource          int
	// opPer1000: operator actions (quarantine, release, pause, resume,
	// skip, raced skip) per store call; QuarantineAfter: the handler's
	// automatic quarantine threshold.
	opPer1000       int
	QuarantineAfter int
	// IdleTTL is the handler's IdleTargetTTL: idle targets' figures are
	// collected by alarms racing the writers, fires and operators
	// (negative: never).
	IdleTTL time.Duration
}

// String is a one-line description for failure reports.
func (sc *Scenario) String() string {
	down := 0
	for _, f := range sc.failures {
		if f.kind != healthy {
			down++
		}
	}
	kind := ""
	if sc.Bulk {
		kind = "bulk "
	}
	if sc.Wide {
		kind = "wide "
	}
	if sc.Loose {
		kind += "loose "
	}
	return fmt.Sprintf("%sseed %d: %d sources (lease %q), %d targets (%d failing), %d writers, budget %+v, caps src %+v tgt %+v, page %dB, skew ±%dms, crash %d‰, ambiguous %d‰, operator %d‰, quarantine after %d, idle ttl %v",
		kind, sc.Seed, len(sc.Sources), sc.LeaseSource, len(sc.Targets), down, len(sc.writers), sc.Budget, sc.SourceLimits, sc.TargetLimits, sc.PageBytes, sc.maxSkewMS, sc.crashPer1000, sc.ambiguousPer1000, sc.opPer1000, sc.QuarantineAfter, sc.IdleTTL)
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// NewScenario derives a scenario from seed; the same seed always gives the
// same scenario. It does not depend on the step budget, so a run with a
// smaller budget is a prefix of the full run (shrinking relies on it).
// With noBulk no seed makes a bulk scenario: every seed then gives the
// scenario it gave before bulk scenarios existed.
func NewScenario(seed uint64, noBulk bool) *Scenario { return newScenario(seed, noBulk, false) }

// newScenario is NewScenario; with noWide no seed makes a wide scenario.
func newScenario(seed uint64, noBulk, noWide bool) *Scenario {
	r := rand.New(rand.NewPCG(seed, 0x5eed5eed))
	// Bulk decisions draw from their own stream, so every other scenario is
	// the same as before bulk scenarios existed (regression seeds replay).
	rb := rand.New(rand.NewPCG(seed, 0xb0b0b0b0))
	sc := &Scenario{
		Bulk:     rb.IntN(3) == 0 && !noBulk,
		Seed:     seed,
		keys:     map[relaycore.Partition][]keySpec{},
		failures: map[relaycore.Partition]failure{},
		hookObs:  map[relaycore.Partition][]relaycore.KV{},
	}
	nSrc := 2 + r.IntN(3)
	for i := range nSrc {
		sc.Sources = append(sc.Sources, relaycore.Partition(fmt.Sprintf("s%d", i)))
	}
	nTgt := 3 + r.IntN(10)
	for i := range nTgt {
		name := fmt.Sprintf("t%02d", i)
		if sc.Bulk && i%2 == 1 {
			// "<" makes rs store the name in base64, its longest encoding.
			name += "<" + strings.Repeat("x", 60+rb.IntN(relaycore.MaxPartitionLen-64))
		}
		sc.Targets = append(sc.Targets, relaycore.Partition(name))
	}
	if r.IntN(3) > 0 {
		sc.LeaseSource = sc.Sources[len(sc.Sources)-1]
	}

	// Key space: every target has a few keys; each is shared (same value
	// from every producer, never deleted) or owned by one source.
	for _, t := range sc.Targets {
		n := 3 + r.IntN(5)
		for k := range n {
			ks := keySpec{Key: fmt.Sprintf("k%d", k)}
			if r.IntN(4) > 0 {
				ks.Owner = sc.Sources[r.IntN(nSrc)]
			}
			sc.keys[t] = append(sc.keys[t], ks)
		}
		if r.IntN(3) == 0 {
			sc.hookObs[t] = []relaycore.KV{{Key: "obs", Value: []byte("holder-" + string(t))}}
		}
	}

	// Failures: some transient, some outages that heal, at most two that
	// never heal (the "permanently failing" targets of quiescence).
	forever := 0
	for _, t := range sc.Targets {
		switch x := r.IntN(10); {
		case x < 2:
			sc.failures[t] = failure{kind: transient, per100: 20 + r.IntN(50)}
		case x < 4:
			from := r.IntN(outageSpan)
			heal := from + 1 + r.IntN(outageSpan)
			if forever < 2 && r.IntN(3) == 0 {
				heal, forever = -1, forever+1
			}
			sc.failures[t] = failure{kind: outage, from: from, heal: heal}
		}
	}

	small := r.IntN(2) == 0
	sc.SourceLimits = Limits{MaxBatchItems: 100, MaxBatchBytes: 4 << 20, MaxItemBytes: 400 << 10}
	sc.TargetLimits = sc.SourceLimits
	if small {
		sc.SourceLimits = Limits{MaxBatchItems: pick(r, 6, 8, 12, 25), MaxBatchBytes: pick(r, 24<<10, 64<<10), MaxItemBytes: pick(r, 4<<10, 8<<10)}
	}
	if r.IntN(2) == 0 {
		sc.TargetLimits = Limits{MaxBatchItems: pick(r, 6, 8, 16), MaxBatchBytes: pick(r, 2<<10, 8<<10, 64<<10), MaxItemBytes: pick(r, 1<<10, 4<<10)}
	}
	sc.PageBytes = pick(r, 0, 160, 300, 700)
	sc.Budget = relaycore.RelayBudget{
		FiresPerAlarm:  1 + r.IntN(3),
		TargetsPerFire: 1 + r.IntN(4),
		CallsPerTarget: 1 + r.IntN(2),
		RowsPerFire:    pick(r, 2, 4, 8, 32),
	}
	sc.ClaimTTL = time.Duration(1+r.IntN(6)) * time.Second
	sc.BackoffMax = time.Duration(1+r.IntN(4)) * time.Second
	sc.LeaseTTL = time.Duration(2+r.IntN(6)) * time.Second
	sc.SkewMargin = time.Duration(200+r.IntN(1500)) * time.Millisecond
	sc.maxSkewMS = pick[int64](r, 0, 300, 1500, 3000)
	sc.crashPer1000 = pick(r, 0, 5, 15, 30)
	sc.ambiguousPer1000 = pick(r, 0, 5, 20)
	sc.kickLossPer100 = pick(r, 0, 30, 100)
	sc.kickDupPer100 = pick(r, 0, 30)
	sc.firePer1000 = pick(r, 0, 5, 20)
	sc.maxFiresPerSource = 1 + r.IntN(3)

	// Writers: 1-3 per source (several make os CAS races); the
	// lease-required source gets two competing lease holders instead, and
	// sometimes a lease-less writer that must be refused.
	value := 0
	for _, s := range sc.Sources {
		n := 1 + r.IntN(3)
		lease := s == sc.LeaseSource
		if lease {
			n = 2
		}
		for w := range n {
			wp := &writerPlan{name: fmt.Sprintf("w%d%s", w, s), source: s, lease: lease}
			if lease {
				wp.name = fmt.Sprintf("L%d%s", w, s)
			}
			nb := 2 + r.IntN(8)
			for range nb {
				bp := batchPlan{sleepMS: int64(r.IntN(3) * r.IntN(1500))}
				if r.IntN(5) == 0 {
					bp.deadlineMS = int64(r.IntN(400))
				}
				nr := 1 + r.IntN(6)
				for range nr {
					if row, ok := sc.genRow(r, s, &value); ok {
						bp.rows = append(bp.rows, row)
					}
				}
				if len(bp.rows) > 0 {
					wp.batches = append(wp.batches, bp)
				}
			}
			sc.writers = append(sc.writers, wp)
		}
		if lease && r.IntN(2) == 0 {
			wp := &writerPlan{name: "nolease" + string(s), source: s}
			if row, ok := sc.genRow(r, s, &value); ok {
				wp.batches = append(wp.batches, batchPlan{rows: []relaycore.Row{row}, sleepMS: int64(r.IntN(3000))})
				sc.writers = append(sc.writers, wp)
			}
		}
	}
	if sc.Bulk {
		sc.bulk(rb)
	}
	// Wide decisions have their own stream too; regression seeds (noBulk)
	// stay as they were.
	rw := rand.New(rand.NewPCG(seed, 0x71de71de))
	if sc.Wide = !sc.Bulk && !noBulk && rw.IntN(10) == 0 && !noWide; sc.Wide {
		sc.wide(rw)
	}
	// Operators draw from their own stream, so the rest of a seed's
	// scenario is what it was before they existed.
	ro := rand.New(rand.NewPCG(seed, 0x0a0a0a0a))
	sc.opPer1000 = pick(ro, 0, 10, 30)
	sc.QuarantineAfter = pick(ro, 2, 3, 10)
	// So do loose deletes; regression seeds (noBulk) stay as they were.
	rl := rand.New(rand.NewPCG(seed, 0x1005ede1))
	sc.Loose = !noBulk && rl.IntN(2) == 0
	// Idle collection draws from its own stream too.
	rc := rand.New(rand.NewPCG(seed, 0x1d1ec011))
	sc.IdleTTL = pick(rc, -1, time.Millisecond, 50*time.Millisecond, 300*time.Millisecond, 2*time.Second, 15*time.Second)
	return sc
}

// genRow makes one row of source s: 1-4 keys of one target that s may
// write. Owned keys get a put of a unique value or a delete; shared keys a
// put of their fixed value.
func (sc *Scenario) genRow(r *rand.Rand, s relaycore.Partition, value *int) (relaycore.Row, bool) {
	for range 8 {
		t := sc.Targets[r.IntN(len(sc.Targets))]
		var mine []keySpec
		for _, k := range sc.keys[t] {
			if k.Owner == "" || k.Owner == s {
				mine = append(mine, k)
			}
		}
		if len(mine) == 0 {
			continue
		}
		r.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
		n := 1 + r.IntN(min(4, len(mine)))
		row := relaycore.Row{Target: t}
		for _, k := range mine[:n] {
			switch {
			case k.Owner == "":
				row.Puts = append(row.Puts, relaycore.KV{Key: k.Key, Value: sharedValue(t, k.Key)})
			case r.IntN(4) == 0:
				row.Deletes = append(row.Deletes, k.Key)
			default:
				*value++
				v := fmt.Sprintf("%s.%d", s, *value)
				if r.IntN(8) == 0 {
					v += string(make([]byte, r.IntN(300)))
				}
				row.Puts = append(row.Puts, relaycore.KV{Key: k.Key, Value: []byte(v)})
			}
		}
		return row, true
	}
	return relaycore.Row{}, false
}

func sharedValue(t relaycore.Partition, key string) []byte {
	return []byte("shared." + string(t) + "." + key)
}

// wide turns sc into a wide scenario (Scenario.Wide). The wide targets have
// one key each, owned by the first source (never the lease-required one),
// and are down for the whole chaos phase. Every draw comes from rw.
func (sc *Scenario) wide(rw *rand.Rand) {
	src := sc.Sources[0]
	n := relaycore.MaxBlockedTargets + 2 + rw.IntN(8)
	wp := &writerPlan{name: "wide" + string(src), source: src}
	var bp batchPlan
	for i := range n {
		t := relaycore.Partition(fmt.Sprintf("w%02d", i))
		sc.Targets = append(sc.Targets, t)
		sc.keys[t] = []keySpec{{Key: "k", Owner: src}}
		sc.failures[t] = failure{kind: outage, from: 0, heal: math.MaxInt32} // heals when the chaos ends
		bp.rows = append(bp.rows, relaycore.Row{Target: t, Puts: []relaycore.KV{{Key: "k", Value: []byte(fmt.Sprintf("wide.%d", i))}}})
	}
	wp.batches = []batchPlan{bp}
	sc.writers = append([]*writerPlan{wp}, sc.writers...)
	sc.Budget.TargetsPerFire = pick(rw, 3, 5, 7)
}

// wideChaos is how many times the chaos budget a wide scenario gets: its
// fires need more store calls than the others' to meet 33 failing targets a
// few at a time, with back-off between them.
const wideChaos = 4

// chaosFactor multiplies the run's chaos budget (Config.Steps) for sc.
func (sc *Scenario) chaosFactor() int {
	if sc.Wide {
		return wideChaos
	}
	return 1
}
