package sim

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Shrink looks for a smaller run of the same seed that still fails: first
// the smallest chaos budget (binary search over Steps; a run with a smaller
// budget is a prefix of the larger one until quiescence begins), then
// without each writer in turn. It returns the smallest failing
// configuration and its result, re-run with the trace on.
func Shrink(ctx context.Context, cfg Config) (Config, Result) {
	fails := func(c Config) bool { return Run(ctx, c).Failed() }
	lo, hi := 0, cfg.Steps // hi fails; find the smallest failing budget
	for lo+1 < hi {
		mid := (lo + hi) / 2
		c := cfg
		c.Steps = mid
		if fails(c) {
			hi = mid
		} else {
			lo = mid
		}
	}
	cfg.Steps = hi
	sc := newScenario(cfg.Seed, cfg.NoBulk, cfg.NoWide)
	for i := range sc.writers {
		if cfg.DropWriters[i] {
			continue
		}
		c := cfg
		c.DropWriters = map[int]bool{i: true}
		for k, v := range cfg.DropWriters {
			c.DropWriters[k] = v
		}
		if fails(c) {
			cfg = c
		}
	}
	cfg.Trace = true
	return cfg, Run(ctx, cfg)
}

// Report formats a failing run for a test log: the scenario, the
// violations, and the trace (its last maxLines lines).
func Report(cfg Config, res Result, maxLines int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nsteps %d, store calls %d (chaos %d), crashes %d, dropped writers %v\n",
		res.Scenario, cfg.Steps, res.Calls, res.ChaosCalls, res.Crashes, DropList(cfg.DropWriters))
	for i, v := range res.Violations {
		if i == 10 {
			fmt.Fprintf(&b, "... and %d more violations\n", len(res.Violations)-10)
			break
		}
		fmt.Fprintf(&b, "VIOLATION %s\n", v)
	}
	tr := res.Trace
	if len(tr) > maxLines {
		fmt.Fprintf(&b, "trace: last %d of %d lines\n", maxLines, len(tr))
		tr = tr[len(tr)-maxLines:]
	} else if len(tr) > 0 {
		fmt.Fprintf(&b, "trace: %d lines (call, sim time, actor, op, store, partition, keys, outcome)\n", len(tr))
	}
	for _, l := range tr {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// DropList renders dropped writers as the -drop flag value.
func DropList(m map[int]bool) string {
	var xs []int
	for i, v := range m {
		if v {
			xs = append(xs, i)
		}
	}
	slices.Sort(xs)
	var parts []string
	for _, x := range xs {
		parts = append(parts, strconv.Itoa(x))
	}
	return strings.Join(parts, ",")
}
