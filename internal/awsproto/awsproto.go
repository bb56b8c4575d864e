// Package awsproto holds the request contracts of the AWS APIs the relay
// calls, as the endpoints that stand in for AWS check them: the test fakes
// (infra/lambdainvoke/invoketest, infra/scheduler/schedulertest) and the
// emulated deployment (lambda/emudeploy). One copy, so a fake and the
// emulator cannot disagree about what a valid request is. It links no test
// code: lambda/emudeploy runs in benchmarks as a product would.
package awsproto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/relay-dev/relay/infra/scheduler"
)

// Signed reports whether r carries a SigV4 signature, as every request
// from the real SDK clients does.
func Signed(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ")
}

// WriteError answers an AWS JSON-protocol error: typ in X-Amzn-ErrorType,
// which the SDK's deserializers read, and body (the service's own error
// shape) as JSON.
func WriteError(w http.ResponseWriter, status int, typ string, body map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-ErrorType", typ)
	w.WriteHeader(status)
	data, _ := json.Marshal(body)
	_, _ = w.Write(data)
}

// FireEvent is the fire function's asynchronous event as the relay sends
// it: a fast kick carries no hop, a continuation its hop (≥ 1).
type FireEvent struct {
	Source string
	Hop    int // 0: a fast kick
}

// ParseInvoke checks r against what the relay's async invokes of function
// must be (POST .../functions/<function>/invocations, unqualified, signed,
// InvocationType Event, a FireEvent body with no unknown fields) and
// returns the body and its event, or the problem found.
func ParseInvoke(r *http.Request, function string) ([]byte, FireEvent, string) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/2015-03-31/functions/")
	rawName, ok2 := strings.CutSuffix(rest, "/invocations")
	if r.Method != http.MethodPost || !ok || !ok2 {
		return nil, FireEvent{}, fmt.Sprintf("unexpected request %s %s (only Invoke is expected)", r.Method, r.URL.Path)
	}
	name, err := url.PathUnescape(rawName)
	if err != nil || name != function {
		return nil, FireEvent{}, fmt.Sprintf("invoke of %q: only %q may be invoked", rawName, function)
	}
	if q := r.URL.Query().Get("Qualifier"); q != "" {
		return nil, FireEvent{}, fmt.Sprintf("invoke with qualifier %q: the fire function is invoked unqualified", q)
	}
	if !Signed(r) {
		return nil, FireEvent{}, "invoke not signed with SigV4"
	}
	if typ := r.Header.Get("X-Amz-Invocation-Type"); typ != "Event" {
		return nil, FireEvent{}, fmt.Sprintf("invocation type %q, want Event (a kick or continuation must not wait for the fire)", typ)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, FireEvent{}, fmt.Sprintf("read body: %v", err)
	}
	var ev struct {
		Source *string `json:"source"`
		Hop    *int    `json:"hop"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return nil, FireEvent{}, fmt.Sprintf("event %s: %v", data, err)
	}
	switch {
	case ev.Source == nil || *ev.Source == "":
		return nil, FireEvent{}, fmt.Sprintf("event %s: no source", data)
	case ev.Hop == nil:
		return data, FireEvent{Source: *ev.Source}, "" // a fast kick
	case *ev.Hop < 1:
		return nil, FireEvent{}, fmt.Sprintf("event %s: a continuation carries hop ≥ 1 (a fast kick carries none)", data)
	}
	return data, FireEvent{Source: *ev.Source, Hop: *ev.Hop}, ""
}

// Schedule is a CreateSchedule request as the relay's kicker
// (infra/scheduler) sends it: a one-time schedule of the fire function.
type Schedule struct {
	Name, Group string
	// Expression is the at(...) expression; At is its time (UTC).
	Expression string
	At         time.Time
	TargetARN  string
	RoleARN    string
	// Input is the target input: the fire function's event.
	Input string
}

// createScheduleBody is CreateSchedule's JSON body; a field the relay does
// not send is refused as unknown.
type createScheduleBody struct {
	ActionAfterCompletion      string
	ClientToken                string
	Description                string
	FlexibleTimeWindow         struct{ Mode string }
	GroupName                  string
	ScheduleExpression         string
	ScheduleExpressionTimezone string
	State                      string
	Target                     struct{ Arn, RoleArn, Input string }
}

// ParseCreateSchedule checks r against what the relay's kicker must send
// (POST /schedules/{Name} with a valid kick name, signed, a body with no
// unknown fields: at(yyyy-mm-ddThh:mm:ss) in UTC, in a group, flexible
// window OFF, deleted after completion, a target with an ARN, a role and
// JSON input, a client token) and returns the schedule, or the problem
// found.
func ParseCreateSchedule(r *http.Request) (Schedule, string) {
	rawName, ok := strings.CutPrefix(r.URL.EscapedPath(), "/schedules/")
	if r.Method != http.MethodPost || !ok {
		return Schedule{}, fmt.Sprintf("unexpected request %s %s (only CreateSchedule is expected)", r.Method, r.URL.Path)
	}
	name, err := url.PathUnescape(rawName)
	if err != nil || !scheduler.ValidName(name) {
		return Schedule{}, fmt.Sprintf("invalid schedule name %q", rawName)
	}
	if !Signed(r) {
		return Schedule{}, name + ": request not signed with SigV4"
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return Schedule{}, fmt.Sprintf("%s: read body: %v", name, err)
	}
	var b createScheduleBody
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return Schedule{}, fmt.Sprintf("%s: body %s: %v", name, data, err)
	}
	at, err := parseAt(b.ScheduleExpression)
	switch {
	case err != nil:
		return Schedule{}, fmt.Sprintf("%s: %v", name, err)
	case b.GroupName == "":
		return Schedule{}, name + ": no GroupName (relay schedules live in a dedicated group)"
	case b.ScheduleExpressionTimezone != "UTC":
		return Schedule{}, fmt.Sprintf("%s: timezone %q, want UTC", name, b.ScheduleExpressionTimezone)
	case b.FlexibleTimeWindow.Mode != "OFF":
		return Schedule{}, fmt.Sprintf("%s: flexible window %q, want OFF", name, b.FlexibleTimeWindow.Mode)
	case b.ActionAfterCompletion != "DELETE":
		return Schedule{}, fmt.Sprintf("%s: ActionAfterCompletion %q, want DELETE", name, b.ActionAfterCompletion)
	case b.Target.Arn == "" || b.Target.RoleArn == "":
		return Schedule{}, name + ": target without Arn or RoleArn"
	case !json.Valid([]byte(b.Target.Input)):
		return Schedule{}, fmt.Sprintf("%s: target input %q is not JSON", name, b.Target.Input)
	case b.ClientToken == "":
		return Schedule{}, name + ": no ClientToken"
	}
	return Schedule{
		Name: name, Group: b.GroupName, Expression: b.ScheduleExpression, At: at,
		TargetARN: b.Target.Arn, RoleARN: b.Target.RoleArn, Input: b.Target.Input,
	}, ""
}

func parseAt(expr string) (time.Time, error) {
	inner, ok := strings.CutPrefix(expr, "at(")
	if ok {
		inner, ok = strings.CutSuffix(inner, ")")
	}
	if !ok {
		return time.Time{}, fmt.Errorf("expression %q is not at(...)", expr)
	}
	t, err := time.Parse("2006-01-02T15:04:05", inner)
	if err != nil {
		return time.Time{}, fmt.Errorf("expression %q: %w", expr, err)
	}
	return t.UTC(), nil
}
