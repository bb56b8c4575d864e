package api_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/relay-dev/relay/lambda/api"
)

// openAPIDoc is the part of docs/openapi.yaml the check reads.
type openAPIDoc struct {
	OpenAPI string                          `yaml:"openapi"`
	Paths   map[string]map[string]yaml.Node `yaml:"paths"`
}

type openAPIOperation struct {
	OperationID string   `yaml:"operationId"`
	Routes      []string `yaml:"x-relay-routes"`
}

// TestOpenAPIMatchesRoutes: docs/openapi.yaml parses, is OpenAPI 3.1, and
// lists exactly the handler's routes (path and method), each with the
// route sets that serve it; and every documented route reaches its handler
// in the set(s) the document names (not a 404 or 405).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	documented := map[string][]string{}
	for path, item := range doc.Paths {
		for method, node := range item {
			if method == "parameters" || strings.HasPrefix(method, "x-") {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			var op openAPIOperation
			if err := node.Decode(&op); err != nil {
				t.Errorf("%s: %v", key, err)
			}
			if op.OperationID == "" {
				t.Errorf("%s: no operationId", key)
			}
			documented[key] = slices.Sorted(slices.Values(op.Routes))
		}
	}
	served := map[string][]string{}
	for _, r := range api.Routes() {
		var sets []string
		if r.Operator {
			sets = append(sets, "operator")
		}
		if r.Producer {
			sets = append(sets, "producer")
		}
		served[r.Method+" "+r.Pattern] = sets
	}
	for k, sets := range documented {
		want, ok := served[k]
		switch {
		case !ok:
			t.Errorf("docs/openapi.yaml documents %s, which the handler does not serve", k)
		case !slices.Equal(sets, want):
			t.Errorf("%s: x-relay-routes %v, the handler serves it in %v", k, sets, want)
		}
	}
	for k := range served {
		if _, ok := documented[k]; !ok {
			t.Errorf("the handler serves %s, which docs/openapi.yaml does not document", k)
		}
	}

	// Each documented route, with its parameters filled in, reaches its
	// handler in each set naming it: the answer is not the router's.
	for k, sets := range documented {
		method, path, _ := strings.Cut(k, " ")
		path = strings.NewReplacer("{source}", "orders", "{target}", "t1", "{entry}", "1").Replace(path)
		for _, set := range sets {
			r := newOpRig(t, api.RouteSet(set))
			resp := r.h.Serve(t.Context(), api.Request{Method: method, Path: path, Caller: operatorARN, Headers: map[string]string{}})
			if resp.Status == 405 || (resp.Status == 404 && strings.Contains(string(resp.Body), `"not_found"`)) {
				t.Errorf("%s in set %s: the router answered %d %s", k, set, resp.Status, resp.Body)
			}
		}
	}
}
