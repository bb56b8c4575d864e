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
