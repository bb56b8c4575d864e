package apitest_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/api/apitest"
	"github.com/relay-dev/relay/relaycore"
)

var update = flag.Bool("update", false, "record testdata/transcript.json from the in-process host")

// inProcess serves the API with api.Handler.Serve on a bbolt file, one
// handler per route set as the two function URLs do, and runs alarms with
// a RelayHandler in Settle.
type inProcess struct {
	h     map[apitest.Role]*api.Handler
	relay *relaycore.RelayHandler
}

func newInProcess(t *testing.T) *inProcess {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Check(); err != nil {
			t.Error(err)
		}
		db.Close()
	})
	src, dst := db.Store("source"), db.Store("target")
	budget, err := relaycore.PlanBudget("free")
	if err != nil {
		t.Fatal(err)
	}
	relay := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget}
	host := &inProcess{relay: relay, h: map[apitest.Role]*api.Handler{}}
	for role, set := range map[apitest.Role]api.RouteSet{apitest.Producer: api.RoutesProducer, apitest.Operator: api.RoutesOperator} {
		host.h[role] = &api.Handler{Source: src, Target: dst, Relay: relay, Routes: set}
	}
	return host
}

func (p *inProcess) Do(t testing.TB, req apitest.Request) apitest.Response {
	resp := p.h[req.Role].Serve(t.Context(), api.Request{Method: req.Method, Path: req.Path, Query: req.Query,
		Headers: req.Headers, Body: req.Body, Caller: "arn:aws:sts::123456789012:assumed-role/" + string(req.Role) + "/conformance"})
	return apitest.Response{Status: resp.Status, Headers: resp.Headers, Body: resp.Body}
}

func (p *inProcess) Settle(t testing.TB, source string) {
	for range 20 {
		res, err := p.relay.Alarm(t.Context(), relaycore.Partition(source))
		if err != nil {
			t.Fatalf("alarm %s: %v", source, err)
		}
		if res.Cleared {
			return
		}
	}
}

// TestInProcess runs the conformance scenario on the handler itself, the
// reference host; with -update it records the transcript every other host
// is compared with.
func TestInProcess(t *testing.T) {
	got := apitest.Run(t, newInProcess(t), *update)
	if !*update {
		return
	}
	data, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "transcript.json"), append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// diverging answers one step differently from the host it wraps.
type diverging struct {
	apitest.Host
	path   string
	status int
}

func (d diverging) Do(t testing.TB, req apitest.Request) apitest.Response {
	resp := d.Host.Do(t, req)
	if req.Path == d.path && req.Method == "POST" && len(req.Body) > 1<<20 {
		resp.Status = d.status
	}
	return resp
}

// TestDiffCatchesDivergence: a host that answers one step with another
// status (an oversize body refused with 400 instead of 413, as a host
// with its own body limit might) fails the comparison, naming the step.
func TestDiffCatchesDivergence(t *testing.T) {
	want, err := apitest.Transcript()
	if err != nil {
		t.Fatal(err)
	}
	got := apitest.Play(t, diverging{Host: newInProcess(t), path: "/v1/sources/conf/rows", status: 400})
	diffs := apitest.Diff(want, got)
	if len(diffs) != 1 || !strings.Contains(diffs[0], "step oversize-body") || !strings.Contains(diffs[0], "status 400, want 413") {
		t.Fatalf("diffs %q, want one naming the oversize-body step", diffs)
	}
	if d := apitest.Diff(want, apitest.Play(t, newInProcess(t))); len(d) != 0 {
		t.Fatalf("the reference host differs from its own transcript: %q", d)
	}
}
