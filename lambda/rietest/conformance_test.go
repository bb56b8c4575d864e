//go:build unix

package rietest

import (
	"encoding/json"
	"testing"

	"github.com/relay-dev/relay/lambda/api/apitest"
	"github.com/relay-dev/relay/lambda/fire"
)

// rieHost serves the conformance scenario with the two function URLs
// template.yaml deploys (the api function for producers, the ops function
// for operators), each under the emulator with its env.json section, and
// runs alarms with the fire function.
type rieHost struct {
	fn   map[apitest.Role]*function
	fire *function
}

func (h *rieHost) Do(t testing.TB, req apitest.Request) apitest.Response {
	var ev map[string]any
	if err := json.Unmarshal(readEvent(t.(*testing.T), "api-enqueue.json"), &ev); err != nil {
		t.Fatal(err)
	}
	ev["rawPath"] = req.Path
	ev["rawQueryString"] = req.Query
	headers := ev["headers"].(map[string]any)
	delete(headers, "content-type")
	for k, v := range req.Headers {
		headers[k] = v
	}
	ev["requestContext"].(map[string]any)["http"].(map[string]any)["method"] = req.Method
	ev["requestContext"].(map[string]any)["http"].(map[string]any)["path"] = req.Path
	ev["body"] = string(req.Body)
	ev["isBase64Encoded"] = false
	payload, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var resp urlResponse
	h.fn[req.Role].invokeOK(t.(*testing.T), payload, &resp)
	return apitest.Response{Status: resp.StatusCode, Headers: resp.Headers, Body: []byte(resp.Body)}
}

func (h *rieHost) Settle(t testing.TB, source string) {
	ev, _ := json.Marshal(fire.Event{Source: source})
	for range 20 {
		var res fire.Result
		h.fire.invokeOK(t.(*testing.T), ev, &res)
		if res.Cleared {
			return
		}
	}
}

// TestAPIConformance runs the API conformance scenario (lambda/api/apitest)
// through the emulator: every step must answer as the reference host's
// transcript says (status, error code, headers, body shape), and every
// DynamoDB call must be granted by template.yaml (checkGrants).
func TestAPIConformance(t *testing.T) {
	r := newRig(t)
	h := &rieHost{
		fn:   map[apitest.Role]*function{apitest.Producer: r.start("ApiFunction", nil), apitest.Operator: r.startOperator()},
		fire: r.start("FireFunction", nil),
	}
	apitest.Run(t, h, false)
}
