package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/relay-dev/relay/internal/strictjson"
	"github.com/relay-dev/relay/relaycore"
)

// TargetsResponse answers GET .../targets.
type TargetsResponse struct {
	Source  string                   `json:"source"`
	Targets []relaycore.TargetStatus `json:"targets"`
	// Next, when non-empty, is the after= of the next page.
	Next string `json:"next,omitempty"`
}

// TargetResponse answers GET .../targets/{target} and the state-changing
// actions: the target's status after the action.
type TargetResponse struct {
	Source string                 `json:"source"`
	Status relaycore.TargetStatus `json:"status"`
}

// ActionRequest is the body of quarantine, release, pause and resume.
type ActionRequest struct {
	// Reason is kept in the target's record (at most
	// relaycore.MaxReasonLen bytes); optional.
	Reason string `json:"reason"`
}

// SkipRequest is the body of POST .../skip.
type SkipRequest struct {
	// ExpectFirst must be the target's first undelivered held seq
	// (status.held_first once rows are held); Through the last seq to skip
	// (at most status.held_last). Reason is required.
	ExpectFirst uint64 `json:"expect_first"`
	Through     uint64 `json:"through"`
	Reason      string `json:"reason"`
}

// SkipResponse answers a skip: the archive entry and the target's status.
type SkipResponse struct {
	Source string `json:"source"`
	relaycore.SkipResult
}

func (h *Handler) listTargets(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	q, e := query(req, "state", "all", "after", "limit")
	if e != nil {
		return nil, e
	}
	// The state is checked by the engine (ListTargets: 400 before any read).
	f := relaycore.TargetFilter{State: relaycore.TargetState(q["state"])}
	if v, ok := q["all"]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fail(400, "bad_request", "all %q: want true or false", v)
		}
		f.All = b
	}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, fail(400, "bad_request", "limit %q: want 1..1000", v)
		}
		f.Limit = n
	}
	f.After = relaycore.Partition(q["after"])
	out, next, err := relaycore.ListTargets(ctx, h.Source, m.source, f, h.clock().Now())
	if err != nil {
		return nil, operatorError(err)
	}
	if out == nil {
		out = []relaycore.TargetStatus{}
	}
	return TargetsResponse{Source: string(m.source), Targets: out, Next: string(next)}, nil
}

func (h *Handler) getTarget(ctx context.Context, m matched, req Request, _ *slog.Logger) (any, error) {
	if _, e := query(req); e != nil {
		return nil, e
	}
	st, err := relaycore.GetTarget(ctx, h.Source, m.source, m.target)
	if err != nil {
		return nil, operatorError(err)
	}
	return TargetResponse{Source: string(m.source), Status: st}, nil
}

// decodeStrict decodes a POST body strictly: application/json, text read
// as written (strictjson.Check), one object, no unknown fields, nothing
// after it.
func decodeStrict(req Request, out any) *apiError {
	if _, e := query(req); e != nil {
		return e
	}
	if e := jsonContent(req); e != nil {
		return e
	}
	if err := strictjson.Check(req.Body, out); err != nil {
		return fail(400, "bad_request", "body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(req.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fail(400, "bad_request", "body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fail(400, "bad_request", "body: trailing data after the JSON object")
	}
	return nil
}

// precheck reads the target's status before the engine takes the source's
// claim, so a request that cannot succeed (unknown target, wrong state)
// writes nothing at all and does not make a running fire step aside. The
// rule is the engine's (Action.AllowedIn), which checks it again under the
// claim; this is only the cheap early no. (Skip needs none here: the
// engine's Skip makes the same early check itself.)
func (h *Handler) precheck(ctx context.Context, m matched, action relaycore.Action) error {
	st, err := relaycore.GetTarget(ctx, h.Source, m.source, m.target)
	if err != nil {
		return operatorError(err)
	}
	if !action.AllowedIn(st.State) {
		return operatorError(&relaycore.TargetStateError{Target: m.target, State: st.State, Action: action})
	}
	return nil
}

// stateActions are the engine's methods behind the state-changing routes.
var stateActions = map[relaycore.Action]func(r *relaycore.RelayHandler, ctx context.Context, source, target relaycore.Partition, a relaycore.Actor) (relaycore.TargetStatus, error){
	relaycore.ActionQuarantine: (*relaycore.RelayHandler).Quarantine,
	relaycore.ActionRelease:    (*relaycore.RelayHandler).Release,
	relaycore.ActionPause:      (*relaycore.RelayHandler).Pause,
	relaycore.ActionResume:     (*relaycore.RelayHandler).Resume,
}

func (h *Handler) act(ctx context.Context, m matched, req Request, log *slog.Logger, action relaycore.Action) (any, error) {
	var in ActionRequest
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	actor := relaycore.Actor{By: actorOf(req.Caller), Reason: in.Reason}
	if err := actor.Validate(action); err != nil {
		return nil, operatorError(err)
	}
	if h.Relay == nil {
		return nil, fail(500, "internal", "operator actions are not configured on this endpoint")
	}
	if err := h.precheck(ctx, m, action); err != nil {
		return nil, err
	}
	var st relaycore.TargetStatus
	err := h.whileBusy(ctx, func() (err error) {
		st, err = stateActions[action](h.Relay, ctx, m.source, m.target, actor)
		return err
	})
	if err != nil {
		return nil, operatorError(err)
	}
	log.Info("api: operator action", "action", string(action), "source", string(m.source), "target", string(m.target),
		"by", actor.By, "reason", actor.Reason, "state", string(st.State))
	return TargetResponse{Source: string(m.source), Status: st}, nil
}

func (h *Handler) quarantine(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	return h.act(ctx, m, req, log, relaycore.ActionQuarantine)
}

func (h *Handler) pause(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	return h.act(ctx, m, req, log, relaycore.ActionPause)
}

func (h *Handler) release(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	return h.act(ctx, m, req, log, relaycore.ActionRelease)
}

func (h *Handler) resume(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	return h.act(ctx, m, req, log, relaycore.ActionResume)
}

func (h *Handler) skip(ctx context.Context, m matched, req Request, log *slog.Logger) (any, error) {
	var in SkipRequest
	if e := decodeStrict(req, &in); e != nil {
		return nil, e
	}
	actor := relaycore.Actor{By: actorOf(req.Caller), Reason: in.Reason}
	sr := relaycore.SkipRequest{Target: m.target, ExpectFirst: in.ExpectFirst, Through: in.Through, Actor: actor}
	if err := sr.Validate(); err != nil {
		return nil, operatorError(err)
	}
	if h.Relay == nil {
		return nil, fail(500, "internal", "operator actions are not configured on this endpoint")
	}
	var res relaycore.SkipResult
	err := h.whileBusy(ctx, func() (err error) {
		res, err = h.Relay.Skip(ctx, m.source, sr)
		return err
	})
	if err != nil {
		return nil, operatorError(err)
	}
	log.Info("api: operator action", "action", string(relaycore.ActionSkip), "source", string(m.source), "target", string(m.target),
		"by", actor.By, "reason", actor.Reason, "archive_id", res.ArchiveID, "rows", res.Rows, "first", res.First, "last", res.Last)
	return SkipResponse{Source: string(m.source), SkipResult: res}, nil
}

// whileBusy runs op, and runs it again while it fails because a fire holds
// the source's claim (relaycore.ErrSourceBusy, ErrContention: nothing was
// changed), for up to BusyWait, backing off from 20 ms to 320 ms. The
// last error is returned when the wait runs out or ctx ends.
func (h *Handler) whileBusy(ctx context.Context, op func() error) error {
	wait := h.BusyWait
	if wait == 0 {
		wait = DefaultBusyWait
	}
	deadline := time.Now().Add(wait)
	pause := 20 * time.Millisecond
	for {
		err := op()
		if !errors.Is(err, relaycore.ErrSourceBusy) && !errors.Is(err, relaycore.ErrContention) {
			return err
		}
		if time.Until(deadline) < pause {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 320*time.Millisecond)
	}
}
