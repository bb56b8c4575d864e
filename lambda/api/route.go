package api

import (
	"net/url"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
)

type action int

const (
	actionRows action = iota + 1
	actionDeliveredThrough
	actionWatermark
	actionState
)

// routes maps the last path segment to its action and method.
var routes = map[string]struct {
	action action
	method string
}{
	"rows":              {actionRows, "POST"},
	"delivered-through": {actionDeliveredThrough, "GET"},
	"watermark":         {actionWatermark, "GET"},
	"state":             {actionState, "GET"},
}

type routed struct {
	action action
	source relaycore.Partition
}

// route matches /v1/sources/{id}/{action} on the raw (still
// percent-encoded) path, so an id may contain an encoded '/'.
func route(req events.LambdaFunctionURLRequest) (routed, *apiError) {
	parts := strings.Split(strings.TrimPrefix(req.RawPath, "/"), "/")
	if len(parts) != 4 || parts[0] != "v1" || parts[1] != "sources" {
		return routed{}, fail(404, "not_found", "no route %s; see docs/deploy.md", req.RawPath)
	}
	r, ok := routes[parts[3]]
	if !ok {
		return routed{}, fail(404, "not_found", "no route %s; see docs/deploy.md", req.RawPath)
	}
	if m := req.RequestContext.HTTP.Method; m != r.method {
		e := fail(405, "method_not_allowed", "%s %s: use %s", m, req.RawPath, r.method)
		e.allow = r.method
		return routed{}, e
	}
	id, err := url.PathUnescape(parts[2])
	if err != nil {
		return routed{}, fail(400, "bad_request", "source id %q: %v", parts[2], err)
	}
	src, err := event.Source("source id", id)
	if err != nil {
		return routed{}, fail(400, "bad_request", "%v", err)
	}
	return routed{action: r.action, source: src}, nil
}

// query parses the raw query string and refuses parameters other than
// allowed and repeated parameters.
func query(req events.LambdaFunctionURLRequest, allowed ...string) (map[string]string, *apiError) {
	vals, err := url.ParseQuery(req.RawQueryString)
	if err != nil {
		return nil, fail(400, "bad_request", "query string: %v", err)
	}
	out := make(map[string]string, len(vals))
	for k, v := range vals {
		known := false
		for _, a := range allowed {
			known = known || a == k
		}
		switch {
		case !known:
			return nil, fail(400, "bad_request", "unknown query parameter %q", k)
		case len(v) != 1:
			return nil, fail(400, "bad_request", "query parameter %q given %d times", k, len(v))
		}
		out[k] = v[0]
	}
	return out, nil
}

// noBody refuses a body on a GET.
func noBody(req events.LambdaFunctionURLRequest) *apiError {
	if req.Body != "" {
		return fail(400, "bad_request", "GET requests take no body")
	}
	return nil
}
