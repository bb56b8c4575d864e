//go:build unix

package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/relay-dev/relay/bench"
)

var flagDurations = flag.String("lambda-durations", "", "write the api and fire functions' measured durations (bench.LambdaDurations, fitted to the invocations of the cases at the template's settings) to this file, which the bill reads: ../../bench/"+bench.DurationsFile)

// durationsOf fits each function's billed duration to the invocations of
// outs (bench.FitDuration): what a Lambda GB-second of the bill costs per
// invocation and per DynamoDB request.
func durationsOf(measuredBy string, outs []outcome) bench.LambdaDurations {
	fit := func(fn string) bench.FunctionDuration {
		var ms []int64
		var reqs []int
		for _, r := range outs {
			for _, inv := range r.invs[fn] {
				ms = append(ms, inv.BilledMillis())
				reqs = append(reqs, inv.DynamoRequests)
			}
		}
		f := bench.FitDuration(ms, reqs)
		f.FixedMS, f.PerRequestMS = math.Round(f.FixedMS*100)/100, math.Round(f.PerRequestMS*100)/100
		return f
	}
	return bench.LambdaDurations{MeasuredBy: measuredBy, API: fit("api"), Fire: fit("fire")}
}

// writeDurations logs the durations measured on outs and, with
// -lambda-durations, writes them.
func writeDurations(tb testing.TB, measuredBy string, outs []outcome) {
	if tb.Failed() || len(outs) == 0 {
		return
	}
	d := durationsOf(measuredBy, outs)
	for _, f := range []struct {
		name string
		fd   bench.FunctionDuration
	}{{"api", d.API}, {"fire", d.Fire}} {
		tb.Logf("%s: %d invocations, %.1f ms billed and %.1f DynamoDB requests each: %.1f ms + %.2f ms per request",
			f.name, f.fd.Invocations, float64(f.fd.BilledMS)/float64(max(f.fd.Invocations, 1)),
			float64(f.fd.DynamoRequests)/float64(max(f.fd.Invocations, 1)), f.fd.FixedMS, f.fd.PerRequestMS)
	}
	if *flagDurations == "" {
		return
	}
	data, err := json.MarshalIndent(d, "", "  ")
	if err == nil {
		err = os.WriteFile(*flagDurations, append(data, '\n'), 0o644)
	}
	if err != nil {
		tb.Error(fmt.Errorf("-lambda-durations: %w", err))
	}
}
