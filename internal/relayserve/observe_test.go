package relayserve_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// What an operator scrapes and reads: /metrics is valid Prometheus text
// exposition, request labels stay bounded whatever paths and methods
// clients send, and the logs are JSON lines naming each request's
// principal and route but never a bearer token, valid or not.
func TestMetricsAndLogs(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	const junkTokens = 3
	var secrets []string
	for _, tok := range f.tokens {
		secrets = append(secrets, tok)
	}
	for i := range junkTokens {
		secrets = append(secrets, fmt.Sprintf("relay_%040d", i)) // unknown tokens are secrets too: a typo of a real one
	}

	for i := range 20 {
		src := fmt.Sprintf("%s/v1/sources/orders", p.URL)
		if r := do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody(fmt.Sprintf("t-%d", i), "k", "v")); r.status != 200 {
			t.Fatalf("enqueue: %d %s", r.status, r.body)
		}
		// Paths and methods no route has: each would be a series if the
		// raw path or method were a label.
		do(t, c, "GET", fmt.Sprintf("%s/junk-%d/x", p.URL, i), f.tokens["reader"], nil)
		do(t, c, fmt.Sprintf("JUNK%d", i), src+"/rows", f.tokens["reader"], nil)
		do(t, c, "GET", fmt.Sprintf("%s/v1/sources/s-%d/state", p.URL, i), f.tokens["reader"], nil)
	}
	for _, tok := range secrets[len(secrets)-junkTokens:] {
		if r := do(t, c, "GET", p.URL+"/v1/sources/orders/state", tok, nil); r.status != 401 {
			t.Fatalf("unknown token: %d", r.status)
		}
	}
	waitDelivered(t, c, p.URL+"/v1/sources/orders", f.tokens["reader"], 20)
	waitMetrics(t, c, p.URL, f.tokens["reader"], `relay_rows_delivered_total{source="orders"} 20`)

	r := do(t, c, "GET", p.URL+"/metrics", f.tokens["reader"], nil)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("/metrics is not valid text exposition: %v\n%s", err, r.body)
	}
	for _, name := range []string{"relay_http_requests_total", "relay_http_request_duration_seconds", "relay_rows_delivered_total", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	routes, methods := map[string]bool{}, map[string]bool{}
	for _, m := range families["relay_http_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "route":
				routes[l.GetValue()] = true
			case "method":
				methods[l.GetValue()] = true
			}
		}
	}
	for route := range routes {
		if strings.Contains(route, "junk") || strings.Contains(route, "s-1") {
			t.Errorf("route label %q holds a raw path", route)
		}
	}
	if !routes["unmatched"] || !routes["/v1/sources/{source}/state"] || len(methods) > 3 {
		t.Errorf("route labels %v, method labels %v", routes, methods)
	}

	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	log := p.Log()
	for _, s := range secrets {
		if strings.Contains(log, s) {
			t.Errorf("the log holds a bearer token %s…", s[:10])
		}
	}
	callers := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, sc.Text())
		}
		if line["msg"] == "http request" {
			if line["route"] == nil || line["status"] == nil {
				t.Errorf("request log line lacks route or status: %s", sc.Text())
			}
			if s, _ := line["caller"].(string); s != "" {
				callers[s] = true
			}
		}
	}
	if !callers["producer"] || !callers["reader"] {
		t.Errorf("request log lines name callers %v, want producer and reader", callers)
	}
}
