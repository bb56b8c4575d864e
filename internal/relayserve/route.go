package relayserve

import (
	"net/url"
	"strings"

	"github.com/relay-dev/relay/lambda/api"
)

// need is the role a request needs.
type need int

const (
	// needAuthenticated: any known principal. Requests that match no route
	// (the handler answers 404 or 405) need only this, so a caller learns
	// nothing about routes before authenticating.
	needAuthenticated need = iota
	needProduce
	needRead
	needOperate
)

func (n need) String() string {
	switch n {
	case needProduce:
		return "produce"
	case needRead:
		return "read"
	case needOperate:
		return "operate"
	}
	return "authenticated"
}

// classified is what the server knows about a request before the API
// handler runs: the route pattern (the metrics label, never the raw path),
// the role it needs, and for producer routes the decoded source.
type classified struct {
	pattern string
	need    need
	source  string
}

// unmatchedPattern labels requests that match no API route.
const unmatchedPattern = "unmatched"

// apiRoute is one route of lambda/api with its pattern split.
type apiRoute struct {
	api.Route
	segs []string
	need need
}

// apiRoutes maps the handler's routes onto roles: routes only producers
// are served (enqueue) need produce on their source; routes in both sets
// (the reads) need read; routes only operators are served need operate.
// The route sets are the Lambda deployment's split between two function
// URLs; here one listener serves both and roles draw the same line.
func apiRoutes() []apiRoute {
	var out []apiRoute
	for _, r := range api.Routes() {
		n := needRead
		switch {
		case r.Producer && !r.Operator:
			n = needProduce
		case r.Operator && !r.Producer:
			n = needOperate
		}
		out = append(out, apiRoute{Route: r, segs: strings.Split(strings.TrimPrefix(r.Pattern, "/"), "/"), need: n})
	}
	return out
}

// classify matches the raw (escaped) path and method against the routes
// as lambda/api does (one segment per parameter; {entry} is decimal).
func classify(routes []apiRoute, method, rawPath string) classified {
	segs := strings.Split(strings.TrimPrefix(rawPath, "/"), "/")
	for _, r := range routes {
		if r.Method != method || len(r.segs) != len(segs) {
			continue
		}
		params, ok := matchSegs(r.segs, segs)
		if !ok {
			continue
		}
		c := classified{pattern: r.Pattern, need: r.need}
		if r.need == needProduce {
			src, err := url.PathUnescape(params["source"])
			if err != nil {
				// The handler refuses the path (400); whoever asks is
				// authenticated first, nothing more.
				return classified{pattern: r.Pattern, need: needAuthenticated}
			}
			c.source = src
		}
		return c
	}
	return classified{pattern: unmatchedPattern, need: needAuthenticated}
}

func matchSegs(pat, segs []string) (map[string]string, bool) {
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
