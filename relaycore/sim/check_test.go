package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/sim"
)

// sources and targets of every scenario are named s0.. and t00..; the
// sabotage functions look through all of them.
func partitions(prefix string, n int, width int) []relaycore.Partition {
	var out []relaycore.Partition
	for i := range n {
		out = append(out, relaycore.Partition(fmt.Sprintf("%s%0*d", prefix, width, i)))
	}
	return out
}

// undeliveredPage finds a page whose first row its target's rh does not
// cover yet.
func undeliveredPage(ctx context.Context, raw sim.Stores) (relaycore.Partition, relaycore.Page, bool) {
	for _, p := range partitions("s", 4, 1) {
		v, err := relaycore.InspectSource(ctx, raw.Source, p)
		if err != nil {
			continue
		}
		for _, pg := range v.Pages {
			rh, err := relaycore.TargetWatermark(ctx, raw.Target, pg.Target, p)
			if err == nil && rh < pg.First {
				return p, pg, true
			}
		}
	}
	return "", relaycore.Page{}, false
}

// sabotageRun runs seeds with sabotage at successive calls until one run
// actually broke something, and returns its result.
func sabotageRun(t *testing.T, sabotage func(ctx context.Context, raw sim.Stores) string) (sim.Config, sim.Result) {
	t.Helper()
	open := memOpener(t)
	for seed := uint64(1); seed < 40; seed++ {
		for at := 40; at <= 360; at += 40 {
			did := ""
			cfg := sim.Config{Seed: seed, Steps: 400, Open: open, SabotageAt: at,
				Sabotage: func(ctx context.Context, raw sim.Stores) string { did = sabotage(ctx, raw); return did }}
			res := sim.Run(t.Context(), cfg)
			if did != "" {
				t.Logf("seed %d, sabotage after call %d: %s", seed, at, did)
				return cfg, res
			}
			if res.Failed() {
				t.Fatalf("seed %d failed without sabotage:\n%s", seed, sim.Report(cfg, res, 0))
			}
		}
	}
	t.Fatal("no run gave the sabotage anything to break")
	return sim.Config{}, sim.Result{}
}

func wantViolation(t *testing.T, cfg sim.Config, res sim.Result, want string) {
	t.Helper()
	for _, v := range res.Violations {
		if strings.Contains(v.Text, want) {
			if v.Call != cfg.SabotageAt {
				t.Errorf("violation found after call %d, want right after the sabotage at %d: %s", v.Call, cfg.SabotageAt, v)
			}
			return
		}
	}
	t.Fatalf("checker missed the sabotage: want a violation containing %q, got:\n%s", want, sim.Report(cfg, res, 0))
}

// TestCheckerCatchesRowDeletedBeforeDelivery deletes an undelivered page
// behind the engine's back: the checker must report it at once.
func TestCheckerCatchesRowDeletedBeforeDelivery(t *testing.T) {
	cfg, res := sabotageRun(t, func(ctx context.Context, raw sim.Stores) string {
		p, pg, ok := undeliveredPage(ctx, raw)
		if !ok {
			return ""
		}
		if err := raw.Source.Apply(ctx, p, relaycore.Batch{Writes: []relaycore.Write{{Key: pg.Key, Delete: true}}}); err != nil {
			t.Errorf("sabotage: %v", err)
			return ""
		}
		return fmt.Sprintf("deleted page %s of %s (rows %d..%d for %s)", pg.Key, p, pg.First, pg.Last(), pg.Target)
	})
	wantViolation(t, cfg, res, "deleted before delivery")
}

// TestCheckerCatchesDoubleApply applies a delivered row's effect a second
// time at the target, after a newer row changed the key: the key then
// differs from the model.
func TestCheckerCatchesDoubleApply(t *testing.T) {
	cfg, res := sabotageRun(t, func(ctx context.Context, raw sim.Stores) string {
		for _, tgt := range partitions("t", 12, 2) {
			pg, err := raw.Target.Scan(ctx, tgt, relaycore.ScanRequest{})
			if err != nil {
				continue
			}
			for _, it := range pg.Items {
				if strings.HasPrefix(it.Key, relaycore.ReservedPrefix) || strings.HasPrefix(it.Key, "h/") || strings.HasPrefix(string(it.Value), "shared.") {
					continue
				}
				// An older effect of the same producer, replayed: the value
				// with its counter lowered.
				old := regexp.MustCompile(`\.(\d+)`).ReplaceAllStringFunc(string(it.Value), func(m string) string {
					n, _ := strconv.Atoi(m[1:])
					return "." + strconv.Itoa(n-1)
				})
				if err := raw.Target.Apply(ctx, tgt, relaycore.Batch{Writes: []relaycore.Write{{Key: it.Key, Value: []byte(old)}}}); err != nil {
					t.Errorf("sabotage: %v", err)
					return ""
				}
				return fmt.Sprintf("rewrote %s/%s from %q to %q without moving rh", tgt, it.Key, it.Value, old)
			}
		}
		return ""
	})
	wantViolation(t, cfg, res, "model")
}

// TestCheckerCatchesRHRegression moves a watermark back, which would let
// the engine apply rows a second time.
func TestCheckerCatchesRHRegression(t *testing.T) {
	cfg, res := sabotageRun(t, func(ctx context.Context, raw sim.Stores) string {
		for _, tgt := range partitions("t", 12, 2) {
			for _, src := range partitions("s", 4, 1) {
				rh, err := relaycore.TargetWatermark(ctx, raw.Target, tgt, src)
				if err != nil || rh == 0 {
					continue
				}
				w := relaycore.Write{Key: relaycore.RHKey(src), Value: []byte(strconv.FormatUint(rh-1, 10))}
				if err := raw.Target.Apply(ctx, tgt, relaycore.Batch{Writes: []relaycore.Write{w}}); err != nil {
					t.Errorf("sabotage: %v", err)
					return ""
				}
				return fmt.Sprintf("moved rh %s/%s back from %d to %d", tgt, src, rh, rh-1)
			}
		}
		return ""
	})
	wantViolation(t, cfg, res, "went back")
}

// TestCheckerCatchesUnblockedCursor moves an active cycle's cursor past an
// undelivered row whose target is not blocked: the blocked-set invariant.
func TestCheckerCatchesUnblockedCursor(t *testing.T) {
	cfg, res := sabotageRun(t, func(ctx context.Context, raw sim.Stores) string {
		p, pg, ok := undeliveredPage(ctx, raw)
		if !ok {
			return ""
		}
		v, err := relaycore.InspectSource(ctx, raw.Source, p)
		if err != nil || pg.First >= v.OS.NextSeq-1 {
			return ""
		}
		rs := relaycore.RelayState{CycleEnd: v.OS.NextSeq - 1, Cursor: pg.First}
		if v.RS != nil {
			rs = *v.RS
			rs.CycleEnd, rs.Cursor = v.OS.NextSeq-1, pg.First
			rs.Blocked = slices.DeleteFunc(rs.Blocked, func(t relaycore.Partition) bool { return t == pg.Target })
		}
		raw1, _ := json.Marshal(rs)
		if err := raw.Source.Apply(ctx, p, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: raw1}}}); err != nil {
			t.Errorf("sabotage: %v", err)
			return ""
		}
		return fmt.Sprintf("set %s rs cursor to %d past undelivered row for %s", p, pg.First, pg.Target)
	})
	wantViolation(t, cfg, res, "which is not blocked")
}

// nonce matches the engine's random hex nonces (batch tags, claim owners),
// also when the trace clipped them.
var nonce = regexp.MustCompile(`"(op-[0-9a-f]{0,12}|[0-9a-f]{4,12})(…|\.|")`)

// TestDeterministic runs one seed twice: the traces must be identical
// except for the engine's random nonces (batch tags, claim owners).
func TestDeterministic(t *testing.T) {
	open := memOpener(t)
	for _, seed := range []uint64{3, 4, 11} { // 4 is a bulk scenario
		var traces [2]string
		for i := range traces {
			res := sim.Run(t.Context(), sim.Config{Seed: seed, Steps: 300, Open: open, Trace: true})
			if res.Failed() {
				t.Fatalf("seed %d failed", seed)
			}
			traces[i] = nonce.ReplaceAllString(strings.Join(res.Trace, "\n"), "NONCE")
		}
		if traces[0] != traces[1] {
			a, b := strings.Split(traces[0], "\n"), strings.Split(traces[1], "\n")
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("seed %d: runs diverge at trace line %d:\n%s\n%s", seed, i, a[i], b[i])
				}
			}
			t.Fatalf("seed %d: traces differ in length: %d vs %d", seed, len(a), len(b))
		}
	}
}
