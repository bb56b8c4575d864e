package awsproto

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/scheduler"
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

// createBody is the body infra/scheduler's kicker sends, with edit applied
// to its fields.
func createBody(edit func(m map[string]any)) string {
	m := map[string]any{
		"ActionAfterCompletion":      "DELETE",
		"ClientToken":                "tok",
		"FlexibleTimeWindow":         map[string]string{"Mode": "OFF"},
		"GroupName":                  "relay-alarms",
		"ScheduleExpression":         "at(2026-12-02T03:04:05)",
		"ScheduleExpressionTimezone": "UTC",
		"State":                      "ENABLED",
		"Target":                     map[string]string{"Arn": fn, "RoleArn": "arn:aws:iam::123456789012:role/s", "Input": `{"source":"orders"}`},
	}
	if edit != nil {
		edit(m)
	}
	data, _ := json.Marshal(m)
	return string(data)
}

func create(path, body string, signed bool) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if signed {
		r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=x")
	}
	return r
}

// TestParseCreateSchedule: the kicker's one-time schedule is accepted with
// its fields; every request the relay must not send names its problem.
func TestParseCreateSchedule(t *testing.T) {
	name := scheduler.ScheduleName("orders", 1764644645)
	path := "/schedules/" + name
	sc, problem := ParseCreateSchedule(create(path, createBody(nil), true))
	want := Schedule{Name: name, Group: "relay-alarms", Expression: "at(2026-12-02T03:04:05)",
		At: time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC), TargetARN: fn, RoleARN: "arn:aws:iam::123456789012:role/s", Input: `{"source":"orders"}`}
	if problem != "" || sc != want {
		t.Fatalf("valid request: %+v %q, want %+v", sc, problem, want)
	}
	field := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	target := func(k, v string) func(map[string]any) {
		return func(m map[string]any) { m["Target"].(map[string]string)[k] = v }
	}
	bad := []struct {
		name string
		r    *http.Request
		want string
	}{
		{"not create", httptest.NewRequest(http.MethodDelete, path, nil), "only CreateSchedule"},
		{"other path", create("/groups/relay-alarms", createBody(nil), true), "only CreateSchedule"},
		{"bad name", create("/schedules/a%2Fb", createBody(nil), true), "invalid schedule name"},
		{"unsigned", create(path, createBody(nil), false), "not signed"},
		{"not JSON", create(path, "{", true), "body"},
		{"unknown field", create(path, createBody(field("StartDate", 1)), true), "unknown field"},
		{"rate", create(path, createBody(field("ScheduleExpression", "rate(1 minute)")), true), "not at(...)"},
		{"bad at", create(path, createBody(field("ScheduleExpression", "at(2026-12-02 03:04)")), true), "expression"},
		{"no group", create(path, createBody(field("GroupName", "")), true), "no GroupName"},
		{"timezone", create(path, createBody(field("ScheduleExpressionTimezone", "Europe/Paris")), true), "want UTC"},
		{"flexible", create(path, createBody(field("FlexibleTimeWindow", map[string]any{"Mode": "FLEXIBLE"})), true), "want OFF"},
		{"kept", create(path, createBody(field("ActionAfterCompletion", "NONE")), true), "want DELETE"},
		{"no role", create(path, createBody(target("RoleArn", "")), true), "without Arn or RoleArn"},
		{"no target", create(path, createBody(target("Arn", "")), true), "without Arn or RoleArn"},
		{"input", create(path, createBody(target("Input", "source=orders")), true), "not JSON"},
		{"no token", create(path, createBody(field("ClientToken", "")), true), "no ClientToken"},
	}
	for _, c := range bad {
		if _, problem := ParseCreateSchedule(c.r); !strings.Contains(problem, c.want) {
			t.Errorf("%s: problem %q, want it to say %q", c.name, problem, c.want)
		}
	}
}
