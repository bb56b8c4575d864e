package rietest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/silenttest"
)

// A service that hangs never turns an answer into "Task timed out":
//   - a kicker's service (Scheduler, or Lambda for the fast kick) that
//     hangs after the rows committed: the enqueue still answers 200 with
//     its seqs (a kick is bounded; the fast kick falls back to Scheduler),
//     so a client never retries rows that committed;
//   - a DynamoDB that hangs: the api answers 503 and the fire an error,
//     both before the function's timeout (the handler's context ends a
//     margin before it), and nothing is written.
func TestHungServicesStillAnswer(t *testing.T) {
	r := newRig(t)
	hung := "http://" + silenttest.Addr(t)
	body := `{"rows":[{"target":"t","puts":[{"key":"k","value":"dg=="}]}]}`

	for _, tc := range []struct {
		name      string
		overrides map[string]string
	}{
		{"scheduler hangs", map[string]string{"FAST_KICK": "false", "RELAY_SCHEDULER_ENDPOINT": hung}},
		{"lambda hangs", map[string]string{"FAST_KICK": "true", "RELAY_LAMBDA_ENDPOINT": hung}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := startWithTimeout(t, "ApiFunction", r.env("ApiFunction", tc.overrides), 15*time.Second)
			schedBefore := r.sched.Stats().Requests
			var res struct{ Seqs []uint64 }
			resp := apiCall(t, api, withPath(t, "POST", "/v1/sources/hung-"+strings.Fields(tc.name)[0]+"/rows", "", body), 200, &res)
			if len(res.Seqs) != 1 || res.Seqs[0] == 0 {
				t.Fatalf("enqueue: %+v, want the committed row's seq", resp)
			}
			if tc.overrides["FAST_KICK"] == "false" {
				if !api.logContains("relay kick failed") {
					t.Errorf("no log line says the kick did not go:\n%s", api.log.String())
				}
				return
			}
			// The hung invoke is given up in time for the fallback to arm
			// the schedule within the kick's bound.
			if !api.logContains("fast kick refused") || r.sched.Stats().Requests == schedBefore {
				t.Errorf("the hung fast kick did not fall back to the scheduler (%d requests):\n%s", r.sched.Stats().Requests-schedBefore, api.log.String())
			}
		})
	}

	t.Run("dynamodb hangs", func(t *testing.T) {
		sentBefore, _ := r.txCount("")
		api := startWithTimeout(t, "ApiFunction", r.env("ApiFunction", map[string]string{"RELAY_DYNAMODB_ENDPOINT": hung}), 8*time.Second)
		var resp urlResponse
		api.invokeOK(t, withPath(t, "POST", "/v1/sources/hung-ddb/rows", "", body), &resp)
		var e struct{ Error struct{ Code string } }
		if err := json.Unmarshal([]byte(resp.Body), &e); err != nil || resp.StatusCode != 503 ||
			(e.Error.Code != "unavailable" && e.Error.Code != "commit_unknown") || resp.Headers["retry-after"] == "" {
			t.Fatalf("enqueue with DynamoDB hung: %+v, want a 503 answer before the timeout", resp)
		}
		fire := startWithTimeout(t, "FireFunction", r.env("FireFunction", map[string]string{"RELAY_DYNAMODB_ENDPOINT": hung}), 12*time.Second)
		status, out := fire.invoke(t, []byte(`{"source":"hung-ddb"}`))
		if status != 200 || !strings.Contains(string(out), "errorMessage") || strings.Contains(string(out), "timed out") {
			t.Fatalf("fire with DynamoDB hung: %d %s, want the handler's error", status, out)
		}
		if sent, _ := r.txCount(""); sent != sentBefore {
			t.Errorf("%d writes reached DynamoDB", sent-sentBefore)
		}
	})
}
