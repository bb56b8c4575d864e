package awsproto

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const fn = "arn:aws:lambda:eu-west-1:123456789012:function:relay-fire"

func invoke(path, typ, body string, signed bool) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if typ != "" {
		r.Header.Set("X-Amz-Invocation-Type", typ)
	}
	if signed {
		r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=x")
	}
	return r
}

// TestParseInvoke: the two events the relay sends are accepted with their
// fields; every other request names its problem.
func TestParseInvoke(t *testing.T) {
	path := "/2015-03-31/functions/" + strings.ReplaceAll(fn, ":", "%3A") + "/invocations"
	ok := []struct {
		body string
		want FireEvent
	}{
		{`{"source":"orders"}`, FireEvent{Source: "orders"}},
		{`{"source":"orders","hop":3}`, FireEvent{Source: "orders", Hop: 3}},
	}
	for _, c := range ok {
		data, ev, problem := ParseInvoke(invoke(path, "Event", c.body, true), fn)
		if problem != "" || ev != c.want || string(data) != c.body {
			t.Errorf("%s: %q %+v %q, want %+v", c.body, data, ev, problem, c.want)
		}
	}
	bad := []struct {
		name string
		r    *http.Request
		want string
	}{
		{"unsigned", invoke(path, "Event", `{"source":"o"}`, false), "not signed"},
		{"sync", invoke(path, "RequestResponse", `{"source":"o"}`, true), "want Event"},
		{"qualifier", invoke(path+"?Qualifier=1", "Event", `{"source":"o"}`, true), "qualifier"},
		{"other function", invoke("/2015-03-31/functions/other/invocations", "Event", `{"source":"o"}`, true), "may be invoked"},
		{"not invoke", invoke("/2015-03-31/functions/"+fn, "Event", `{}`, true), "only Invoke"},
		{"no source", invoke(path, "Event", `{"hop":1}`, true), "no source"},
		{"hop 0", invoke(path, "Event", `{"source":"o","hop":0}`, true), "hop ≥ 1"},
		{"unknown field", invoke(path, "Event", `{"source":"o","x":1}`, true), "unknown field"},
	}
	for _, c := range bad {
		_, _, problem := ParseInvoke(c.r, fn)
		if !strings.Contains(problem, c.want) {
			t.Errorf("%s: problem %q, want it to say %q", c.name, problem, c.want)
		}
	}
}
