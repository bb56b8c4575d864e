//go:build unix

package emudeploy

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
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
	// Every DynamoDB request is some invocation's, and every invocation
	// was timed, once the functions are done (the fire's checkpoint may
	// still run when the rows are applied).
	for _, f := range []*Function{d.api, d.fire, d.sweep} {
		f.Close()
	}
	st = d.Stats()
	reqs := 0
	for _, fn := range []string{"api", "fire", "sweep"} {
		for _, inv := range d.Invocations(fn) {
			reqs += inv.DynamoRequests
			if inv.Duration <= 0 || inv.DynamoRequests == 0 {
				t.Errorf("%s invocation %+v: want a duration and its requests", fn, inv)
			}
		}
	}
	if reqs != st.DynamoRequests || st.API.BilledMillis == 0 || st.Fire.BilledMillis == 0 {
		t.Errorf("invocations made %d DynamoDB requests of the endpoint's %d; billed api %d ms, fire %d ms", reqs, st.DynamoRequests, st.API.BilledMillis, st.Fire.BilledMillis)
	}
	t.Logf("%+v", st)
}

// TestPruneApplied: in process, on virtual time, with PruneApplied the
// rows still reach their targets (Applied has every key) and leave no
// item behind in the target table but the engine's rh records.
func TestPruneApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := Start(Config{InProcess: true, PruneApplied: true, Seed: seed, FireConcurrency: 1, APIConcurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		v := base64.StdEncoding.EncodeToString([]byte("v"))
		var rows []api.RowJSON
		var keys []string
		for i := range 6 {
			k := fmt.Sprintf("prune/%d", i)
			keys = append(keys, k)
			rows = append(rows, api.RowJSON{Target: fmt.Sprintf("t%d", i%2), Puts: []api.PutJSON{{Key: k, Value: &v}}})
		}
		if status, body, err := d.Enqueue(t.Context(), "orders", rows, ""); err != nil || status != 200 {
			t.Fatalf("enqueue: %d %s %v", status, body, err)
		}
		if err := d.WaitApplied(t.Context(), keys); err != nil {
			t.Fatal(err)
		}
		for _, p := range []relaycore.Partition{"t0", "t1"} {
			pg, err := d.Target.Scan(t.Context(), p, relaycore.ScanRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(pg.Items) != 1 || !strings.HasPrefix(pg.Items[0].Key, relaycore.ReservedPrefix) {
				t.Errorf("target %s holds %d items (%v), want only its rh record", p, len(pg.Items), pg.Items)
			}
		}
	})
}

// TestPruneThroughProxy: the front in front of a listening emulator (the
// real-process deployment's path: a reverse proxy on 127.0.0.1) records
// an apply through the real SDK and store, then deletes the row's target
// item and keeps the rh record.
func TestPruneThroughProxy(t *testing.T) {
	ep, err := dynamoemu.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if err := dynamo.CreateTable(t.Context(), ep.Client(nil), TargetTable); err != nil {
		t.Fatal(err)
	}
	front, err := newDynamoFront(ep.URL, TargetTable, nil, seed)
	if err != nil {
		t.Fatal(err)
	}
	front.prune = true
	srv := httptest.NewServer(front)
	defer srv.Close()
	st := dynamo.New(dynamoemu.NewClient(srv.URL, nil), TargetTable, dynamo.Options{})
	rh := relaycore.ReservedPrefix + "rh/orders"
	err = st.Apply(t.Context(), "t0", relaycore.Batch{Writes: []relaycore.Write{{Key: "row/1", Value: []byte("v")}, {Key: rh, Value: []byte("1")}}})
	if err != nil {
		t.Fatal(err)
	}
	direct := dynamo.New(ep.Client(nil), TargetTable, dynamo.Options{})
	if _, ok, err := direct.Get(t.Context(), "t0", "row/1"); err != nil || ok {
		t.Errorf("row/1 still in the table (%v %v)", ok, err)
	}
	if v, ok, err := direct.Get(t.Context(), "t0", rh); err != nil || !ok || string(v) != "1" {
		t.Errorf("rh record %q %v %v, want kept", v, ok, err)
	}
	if _, ok := front.applied["row/1"]; !ok {
		t.Error("the apply of row/1 was not recorded")
	}
}
