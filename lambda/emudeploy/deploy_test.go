//go:build unix

package emudeploy

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

const repoRoot = "../.."

// rie is the emulator `make tools` installs (RELAY_RIE, which `make test`
// sets, or the Makefile's .bin); the test skips without one.
func rie(t *testing.T) string {
	t.Helper()
	p := os.Getenv("RELAY_RIE")
	if p == "" {
		p = filepath.Join(repoRoot, ".bin", "aws-lambda-rie")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no aws-lambda-rie (%v): run `make tools` or set RELAY_RIE", err)
	}
	return p
}

// TestDeploymentDelivers is the smoke run of the emulated deployment: the
// real bootstraps under the emulator, with Scheduler's precision and the
// sweep put an hour away so that it takes seconds and the schedule
// delivers (FAST_KICK=false: the fast path is TestLatencyModel's). Rows enqueued through the api function reach their targets
// through the schedule the enqueue armed, every request the functions made
// kept the services' contracts, and the counts add up.
func TestDeploymentDelivers(t *testing.T) {
	rieBin := rie(t)
	bins, err := Build(repoRoot, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := Start(Config{RIE: rieBin, Bootstraps: bins, Seed: seed, Precision: time.Second, SweepPeriod: time.Hour,
		FireConcurrency: 2, APIConcurrency: 1, Env: map[string]map[string]string{"api": {"FAST_KICK": "false"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		if t.Failed() {
			t.Logf("functions' output:\n%s", d.Logs())
		}
	})
	v := base64.StdEncoding.EncodeToString([]byte("v"))
	var rows []api.RowJSON
	var keys []string
	for i := range 4 {
		k := fmt.Sprintf("smoke/%d", i)
		keys = append(keys, k)
		rows = append(rows, api.RowJSON{Target: fmt.Sprintf("t%d", i%2), Puts: []api.PutJSON{{Key: k, Value: &v}}})
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	status, body, err := d.Enqueue(ctx, "orders", rows, "")
	if err != nil || status != 200 {
		t.Fatalf("enqueue: %d %s %v", status, body, err)
	}
	if err := d.WaitApplied(ctx, keys); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		got, ok, err := d.Target.Get(ctx, relaycore.Partition(fmt.Sprintf("t%d", i%2)), k)
		if err != nil || !ok || string(got) != "v" {
			t.Errorf("target %s: %q %v %v", k, got, ok, err)
		}
	}
	st := d.Stats()
	if st.API.Invocations != 1 || st.Scheduler.Created != 1 || st.Scheduler.Runs != 1 || st.Fire.Invocations < 1 || st.Sweep.Invocations != 0 || st.DynamoRequests == 0 {
		t.Errorf("stats %+v", st)
	}
	if st.Fire.MaxConcurrent > 2 {
		t.Errorf("%d fires at once on 2 environments", st.Fire.MaxConcurrent)
	}
	if v := d.Violations(); len(v) != 0 {
		t.Errorf("contract violations: %q", v)
	}
	t.Logf("%+v", st)
}
