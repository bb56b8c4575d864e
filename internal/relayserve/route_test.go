package relayserve

import (
	"strings"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
)

// Every route of the API handler is classified as itself, with the role
// its route sets imply: a route added to lambda/api gets a role here
// without a change, and the metrics label is the pattern.
func TestClassifyEveryRoute(t *testing.T) {
	routes := apiRoutes()
	for _, r := range api.Routes() {
		path := strings.NewReplacer("{source}", "tenant%2F42", "{target}", "t1", "{entry}", "7").Replace(r.Pattern)
		c := classify(routes, r.Method, path)
		want := needRead
		switch {
		case r.Role() == api.RoleHold:
			want = needHold // a node's own holdings, orders and receipts
		case r.Role() == api.RoleTakedown:
			want = needTakedown
		case r.Producer && !r.Operator:
			want = needProduce
		case r.Operator && !r.Producer && r.Method == "GET" && (strings.HasSuffix(r.Pattern, "/archive/{entry}") || strings.HasSuffix(r.Pattern, "/archive/export")):
			want = needOperateRead // their answers carry rows' keys and values
		case r.Operator && !r.Producer:
			want = needOperate
		}
		if c.pattern != r.Pattern || c.need != want {
			t.Errorf("%s %s: classified %q needing %v; want %q needing %v", r.Method, path, c.pattern, c.need, r.Pattern, want)
		}
		if want == needProduce && c.source != "tenant/42" {
			t.Errorf("%s %s: source %q, want the decoded tenant/42", r.Method, path, c.source)
		}
	}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/sources/s/rows"},       // wrong method: the handler answers 405
		{"POST", "/v1/sources//rows"},       // empty segment
		{"GET", "/v1/sources/s/archive/x1"}, // {entry} is decimal
		{"GET", "/v1/sources/s/rows/extra"}, // too long
		{"POST", "/v1/sources/bad%zz/rows"}, // undecodable source: the handler answers 400
		{"GET", "/nothing"},
	} {
		if c := classify(routes, tc.method, tc.path); c.need != needAuthenticated || c.source != "" {
			t.Errorf("%s %s: classified %+v; want only authentication needed", tc.method, tc.path, c)
		}
	}
}
