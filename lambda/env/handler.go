package env

import (
	"fmt"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/sweep"
)

// VarRoutes names the api function's route set variable (api.ParseRouteSet).
const VarRoutes = "RELAY_API_ROUTES"

// The handlers below are each function's handler built on its wired
// dependencies, as its bootstrap (functions/*/main.go) serves it and as
// the emulated deployment (lambda/emudeploy) runs it in process: one code
// path, so what the benchmarks measure is what ships. They are separate
// methods rather than one switch so that each bootstrap links only its own
// handler's code.

// APIHandler is the api function's handler for the route set getenv's
// RELAY_API_ROUTES selects. Routes that enqueue kick fast (FAST_KICK,
// UseFastKick); the operator route set is the ops function's, whose role
// may not invoke the fire function, so it keeps the Scheduler kicker.
func (d *Deps) APIHandler(getenv func(string) string) (*api.Handler, error) {
	routes, err := api.ParseRouteSet(getenv(VarRoutes))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", VarRoutes, err)
	}
	if routes != api.RoutesOperator {
		d.UseFastKick()
	}
	d.Logger.Info("api: serving", "routes", string(routes))
	return &api.Handler{Source: d.Source, Target: d.Target, Clock: d.Clock, Relay: d.Relay, Routes: routes, Logger: d.Logger,
		Takedowns: d.Takedowns, NodeOf: NodeOf(d.Config.HoldNodes)}, nil
}

// FireHandler is the fire function's handler: alarms for the event's
// source for up to DRAIN_SLICE, continuing through Invoker up to
// CONTINUATION_HOPS.
func (d *Deps) FireHandler() *fire.Handler {
	return &fire.Handler{Relay: d.Relay, Logger: d.Logger, Continue: d.Invoker, MaxHops: d.Config.ContinuationHops, DrainSlice: d.Config.DrainSlice,
		Clock: d.Clock, Metrics: d.Metrics, Takedowns: d.Takedowns}
}

// SweepHandler is the sweep function's handler: every overdue alarm fired
// or re-kicked through the Scheduler kicker.
func (d *Deps) SweepHandler() *sweep.Handler {
	return &sweep.Handler{Relay: d.Relay, Index: d.Source, Source: d.Source, Kicker: d.Kicker, Clock: d.Clock, Logger: d.Logger, Metrics: d.Metrics,
		Takedowns: d.Takedowns}
}
