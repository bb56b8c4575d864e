package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
)

// RouteSet selects the routes a Handler serves.
type RouteSet string

// Route sets. A deployment serves producers and operators from separate
// function URLs (separate IAM grants): producer routes never change a
// target's state, operator routes never enqueue new rows (a requeue
// re-enqueues archived ones).
const (
	// RoutesProducer: enqueue and the read routes (the default). The
	// read routes include the target reads (GET /v1/targets/...): an
	// application reads what relay delivered where it enqueues.
	RoutesProducer RouteSet = "producer"
	// RoutesOperator: the read routes and every operator route.
	RoutesOperator RouteSet = "operator"
	// RoutesAll: every route (an embedded server, tests).
	RoutesAll RouteSet = "all"
)

// ParseRouteSet reads RELAY_API_ROUTES: "" is RoutesProducer; anything
// other than producer, operator or all is an error.
func ParseRouteSet(s string) (RouteSet, error) {
	switch rs := RouteSet(strings.TrimSpace(s)); rs {
	case "":
		return RoutesProducer, nil
	case RoutesProducer, RoutesOperator, RoutesAll:
		return rs, nil
	}
	return "", fmt.Errorf("route set %q: want producer, operator or all", s)
}

// Route is one route: method, path pattern ({source}, {target} and
// {entry} are parameters) and the sets serving it.
type Route struct {
	Method  string
	Pattern string
	// Producer and Operator say which sets serve the route (RoutesAll
	// serves every route).
	Producer, Operator bool

	serve func(h *Handler, ctx context.Context, m matched, req Request, log *slog.Logger) (any, error)
}

func (r Route) in(set RouteSet) bool {
	switch set {
	case RoutesOperator:
		return r.Operator
	case RoutesAll:
		return true
	}
	return r.Producer
}

// routes is the API. Read routes are in both sets.
var routes = []Route{
	{"POST", "/v1/sources/{source}/rows", true, false, (*Handler).enqueue},
	{"GET", "/v1/sources/{source}/delivered-through", true, true, (*Handler).deliveredThrough},
	{"GET", "/v1/sources/{source}/watermark", true, true, (*Handler).watermark},
	{"GET", "/v1/sources/{source}/state", true, true, (*Handler).state},
	{"GET", "/v1/sources/{source}/targets", false, true, (*Handler).listTargets},
	{"GET", "/v1/sources/{source}/targets/{target}", false, true, (*Handler).getTarget},
	{"POST", "/v1/sources/{source}/targets/{target}/quarantine", false, true, (*Handler).quarantine},
	{"POST", "/v1/sources/{source}/targets/{target}/release", false, true, (*Handler).release},
	{"POST", "/v1/sources/{source}/targets/{target}/pause", false, true, (*Handler).pause},
	{"POST", "/v1/sources/{source}/targets/{target}/resume", false, true, (*Handler).resume},
	{"POST", "/v1/sources/{source}/targets/{target}/skip", false, true, (*Handler).skip},
	{"GET", "/v1/sources/{source}/archive", false, true, (*Handler).listArchive},
	{"GET", "/v1/sources/{source}/archive/export", false, true, (*Handler).exportArchive},
	{"GET", "/v1/sources/{source}/archive/{entry}", false, true, (*Handler).getArchive},
	{"POST", "/v1/sources/{source}/archive/{entry}/requeue", false, true, (*Handler).requeue},
	{"GET", "/v1/targets/{target}/items", true, true, (*Handler).targetItems},
	{"GET", "/v1/targets/{target}/watermarks", true, true, (*Handler).targetWatermarks},
	{"POST", "/v1/holdings", true, false, (*Handler).postHoldings},
	{"GET", "/v1/orders", true, false, (*Handler).getOrders},
	{"POST", "/v1/receipts", true, false, (*Handler).postReceipt},
	{"POST", "/v1/takedowns", false, true, (*Handler).postTakedown},
	{"GET", "/v1/takedowns/{takedown}", false, true, (*Handler).getTakedown},
	{"GET", "/v1/takedowns/{takedown}/receipts", false, true, (*Handler).getTakedownReceipts},
	{"POST", "/v1/takedowns/{takedown}/waive", false, true, (*Handler).postWaive},
	{"GET", "/v1/holdings/{content}", false, true, (*Handler).getHolders},
}

// Routes lists every route of the API (for the OpenAPI check and docs).
func Routes() []Route { return slices.Clone(routes) }

// matched is a route with its decoded parameters.
type matched struct {
	route  Route
	source relaycore.Partition
	target relaycore.Partition
	entry  uint64
	// takedown and content are the takedown routes' parameters, decoded
	// (the takedowns package checks them).
	takedown, content string
}

// Match reports whether rawPath (still percent-encoded) fits the route's
// pattern, whatever the method, and returns the raw parameter values: the
// same matching the handler routes by, for hosts that must classify a
// request before it runs (relay serve's roles and metrics labels).
func (r Route) Match(rawPath string) (map[string]string, bool) {
	return match(r.Pattern, strings.Split(strings.TrimPrefix(rawPath, "/"), "/"))
}

// match reports whether the raw path's segments fit pattern, and the raw
// (still encoded) parameter values. {entry} matches decimal ids only, so
// archive/export is never an entry.
func match(pattern string, segs []string) (map[string]string, bool) {
	pat := strings.Split(strings.TrimPrefix(pattern, "/"), "/")
	if len(pat) != len(segs) {
		return nil, false
	}
	params := map[string]string{}
	for i, p := range pat {
		if name, ok := strings.CutPrefix(p, "{"); ok {
			name = strings.TrimSuffix(name, "}")
			if segs[i] == "" || (name == "entry" && strings.Trim(segs[i], "0123456789") != "") {
				return nil, false
			}
			params[name] = segs[i]
			continue
		}
		if p != segs[i] {
			return nil, false
		}
	}
	return params, true
}

// route finds the request's route in the handler's set: 404 when no route
// of the set has the path (a route of the other set included: the message
// says so), 405 with an Allow header when only the method is wrong.
func (h *Handler) route(req Request) (matched, *apiError) {
	set := h.Routes
	if set == "" {
		set = RoutesProducer
	}
	segs := strings.Split(strings.TrimPrefix(req.Path, "/"), "/")
	var (
		allow []string
		other *Route
	)
	for i, r := range routes {
		params, ok := match(r.Pattern, segs)
		if !ok {
			continue
		}
		if !r.in(set) {
			other = &routes[i]
			continue
		}
		if r.Method != req.Method {
			allow = append(allow, r.Method)
			continue
		}
		return decodeParams(r, params)
	}
	switch {
	case len(allow) > 0:
		e := fail(405, "method_not_allowed", "%s %s: use %s", req.Method, req.Path, strings.Join(allow, ", "))
		e.allow = strings.Join(allow, ", ")
		return matched{}, e
	case other != nil:
		return matched{}, fail(404, "not_found", "%s %s is not served here: this endpoint serves the %s routes (docs/api.md)", other.Method, other.Pattern, set)
	}
	return matched{}, fail(404, "not_found", "no route %s; see docs/api.md", req.Path)
}

func decodeParams(r Route, raw map[string]string) (matched, *apiError) {
	m := matched{route: r}
	for name, v := range raw {
		s, err := url.PathUnescape(v)
		if err != nil {
			return m, fail(400, "bad_request", "%s %q: %v", name, v, err)
		}
		switch name {
		case "source":
			p, err := event.Source("source id", s)
			if err != nil {
				return m, fail(400, "bad_request", "%v", err)
			}
			m.source = p
		case "target":
			p, err := event.Target("target", s)
			if err != nil {
				return m, fail(400, "bad_request", "%v", err)
			}
			m.target = p
		case "entry":
			id, err := strconv.ParseUint(s, 10, 64)
			if err != nil || id == 0 {
				return m, fail(400, "bad_request", "archive entry %q is not a positive integer", s)
			}
			m.entry = id
		case "takedown":
			m.takedown = s
		case "content":
			m.content = s
		}
	}
	return m, nil
}

// query parses the raw query string and refuses parameters other than
// allowed and repeated parameters.
func query(req Request, allowed ...string) (map[string]string, *apiError) {
	vals, err := url.ParseQuery(req.Query)
	if err != nil {
		return nil, fail(400, "bad_request", "query string: %v", err)
	}
	out := make(map[string]string, len(vals))
	for k, v := range vals {
		switch {
		case !slices.Contains(allowed, k):
			return nil, fail(400, "bad_request", "unknown query parameter %q", k)
		case len(v) != 1:
			return nil, fail(400, "bad_request", "query parameter %q given %d times", k, len(v))
		}
		out[k] = v[0]
	}
	return out, nil
}
