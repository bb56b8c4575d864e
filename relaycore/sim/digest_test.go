package sim_test

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore/sim"
)

var flagDigest = flag.String("simdigest", "", "write one line per seed (-seeds from -seed, mem store) with its counts and a digest of its trace and violations to this file")

// digestNonce is nonce (TestDeterministic's) plus the nonces a trace line
// clips to fewer than four hex digits.
var digestNonce = regexp.MustCompile(nonce.String() + `|"(op-)?[0-9a-f]{0,12}…`)

// TestSimDigest fingerprints each seed's run: its counts and a sha256 of
// its trace (the engine's random nonces masked, as TestDeterministic does)
// and violations. Two builds of the simulation that produce the same file
// ran every seed the same way, call for call; a change meant only to make
// the simulation faster is checked with it. It runs only with -simdigest.
func TestSimDigest(t *testing.T) {
	if *flagDigest == "" {
		t.Skip("no -simdigest file")
	}
	n := max(*flagSeeds, 1)
	b := backends()[0]
	open := b.setup(t)
	var out strings.Builder
	for seed := *flagSeed; seed < *flagSeed+uint64(n); seed++ {
		cfg := sim.Config{Seed: seed, Steps: b.steps, Open: open, Trace: true, NoBulk: !*flagBulk, NoWide: b.noWide}
		res := sim.Run(t.Context(), cfg)
		h := sha256.New()
		fmt.Fprintln(h, digestNonce.ReplaceAllString(strings.Join(res.Trace, "\n"), "NONCE"))
		for _, v := range res.Violations {
			fmt.Fprintln(h, digestNonce.ReplaceAllString(v.String(), "NONCE"))
		}
		fmt.Fprintf(&out, "seed=%d steps=%d calls=%d chaos=%d crashes=%d ambiguous=%d target_errors=%d committed=%d delivered=%d batches=%d checkpoints=%d/%d/%d ops=%d/%d/%d violations=%d trace=%x\n",
			seed, res.Steps, res.Calls, res.ChaosCalls, res.Crashes, res.Ambiguous, res.TargetErrors, res.Committed, res.Delivered, res.Batches,
			res.Checkpoints, res.Rewrites, res.NearLimit, res.OpActions, res.OpApplied, res.Skipped, len(res.Violations), h.Sum(nil)[:12])
	}
	if err := os.WriteFile(*flagDigest, []byte(out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
