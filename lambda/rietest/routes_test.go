//go:build unix

package rietest

import (
	"strings"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
)

// TestProducerAndOperatorFunctions: the two function URLs template.yaml
// deploys, each started with its own env.json section, serve their own
// route sets only: the api function (RELAY_API_ROUTES=producer) answers
// the operator request events/ops-targets.json with 404, the ops function
// (operator) answers the enqueue events/api-enqueue.json with 404 and
// writes nothing, and serves the operator request. Each function's
// DynamoDB calls are checked against its own role in template.yaml
// (checkGrants), so the operator's grants are exercised under OpsFunction.
func TestProducerAndOperatorFunctions(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	opsFn := r.start("OpsFunction", nil)

	var enq api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)

	resp := apiCall(t, apiFn, readEvent(t, "ops-targets.json"), 404, nil)
	if !strings.Contains(resp.Body, "not_found") {
		t.Errorf("api function on an operator route: %s", resp.Body)
	}
	sent, _ := r.txCount("")
	resp = apiCall(t, opsFn, readEvent(t, "api-enqueue.json"), 404, nil)
	if !strings.Contains(resp.Body, "not_found") {
		t.Errorf("ops function on the enqueue route: %s", resp.Body)
	}
	if after, _ := r.txCount(""); after != sent {
		t.Errorf("the refused enqueue sent %d transactions", after-sent)
	}

	var list api.TargetsResponse
	apiCall(t, opsFn, readEvent(t, "ops-targets.json"), 200, &list)
	if list.Source != "orders" || len(list.Targets) != 0 {
		t.Errorf("quarantined targets %+v, want none yet", list)
	}
}
