package relayserve

import (
	"net/url"

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
	// needOperateRead: operate and read, for operator routes whose
	// answers carry rows' keys and values (the archive's entries and
	// export, the backup). Operating a target (quarantine, skip, requeue)
	// does not show what its rows hold; these answers do, so a principal
	// that may act on targets but not read data cannot read it here
	// either.
	needOperateRead
	// needHold: the hold role (a node's holdings, orders and receipts).
	needHold
	// needTakedown: the takedown role.
	needTakedown
)

func (n need) String() string {
	switch n {
	case needProduce:
		return "produce"
	case needRead:
		return "read"
	case needOperate:
		return "operate"
	case needOperateRead:
		return "operate and read"
	case needHold:
		return "hold"
	case needTakedown:
		return "takedown"
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

// apiRoute is one route of lambda/api with the role it needs.
type apiRoute struct {
	api.Route
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
		case r.Role() == api.RoleHold:
			n = needHold
		case r.Role() == api.RoleTakedown:
			n = needTakedown
		case r.Producer && !r.Operator:
			n = needProduce
		case r.Operator && !r.Producer && dataRoutes[r.Method+" "+r.Pattern]:
			n = needOperateRead
		case r.Operator && !r.Producer:
			n = needOperate
		}
		out = append(out, apiRoute{Route: r, need: n})
	}
	return out
}

// dataRoutes are the operator routes whose answers carry rows' keys and
// values (needOperateRead). The archive listing carries summaries only
// (ids, seqs, counts, who, why).
var dataRoutes = map[string]bool{
	"GET /v1/sources/{source}/archive/{entry}": true,
	"GET /v1/sources/{source}/archive/export":  true,
}

// classify matches the raw (escaped) path and method against the routes
// with lambda/api's own matching (api.Route.Match).
func classify(routes []apiRoute, method, rawPath string) classified {
	for _, r := range routes {
		if r.Method != method {
			continue
		}
		params, ok := r.Match(rawPath)
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
