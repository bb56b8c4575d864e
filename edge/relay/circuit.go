package relay

import (
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
)

// The dial circuit keeps a silent, down peer from starving the others.
// Without it every due record for an unreachable peer costs a worker a
// full dial_timeout (1000 segments at 10s: 42 minutes of one worker per
// retry round) and an attempt of its budget.
//
// States, per peer:
//
//	closed     dials go ahead (the initial state, and after any successful dial)
//	open       a dial failed; until ReopenAt, records for the peer that come due
//	           are deferred to ReopenAt (ledger.Defer: no attempt counted, no dial)
//	half_open  ReopenAt has passed: the next due record is the probe, an ordinary
//	           attempt that dials; while it dials, the peer's other due records
//	           are deferred to the probe's dial deadline, or to when a failed
//	           probe would reopen the circuit if that is sooner. The probe's dial decides:
//	           success closes the circuit, failure opens it again for longer.
//
// The n-th consecutive failed round keeps the circuit open for
// Policy.Backoff(n) (relay.backoff: bounded exponential, no jitter). Dials
// that fail while the circuit is already open (started before it opened)
// do not lengthen it, so N workers failing at once count as one round.
// A record that is dialled is counted and failed exactly as before.

// CircuitState is the state of a peer's dial circuit.
type CircuitState string

// The circuit states.
const (
	CircuitClosed   CircuitState = "closed"
	CircuitOpen     CircuitState = "open"
	CircuitHalfOpen CircuitState = "half_open"
)

// CircuitStates lists the states (for metrics).
func CircuitStates() []CircuitState {
	return []CircuitState{CircuitClosed, CircuitOpen, CircuitHalfOpen}
}

// Circuit is a peer's dial circuit as reported to operators.
type Circuit struct {
	Peer  string
	State CircuitState
	// Failures is the number of consecutive failed dial rounds.
	Failures int
	// ReopenAt is when an open circuit half-opens (zero when closed).
	ReopenAt time.Time
	// Probing is true while the half-open probe is dialling.
	Probing bool
	// LastError is the last dial failure, kept after the circuit closes.
	LastError string
	// NotDialed: this process has not dialled the peer yet (nothing owed
	// to it has come due since the start), so its closed circuit says
	// nothing about whether it is reachable.
	NotDialed bool
	// Room is the peer's room circuit (full.go): open while it refuses
	// for want of room, with RoomRefusals consecutive refusing rounds,
	// until RoomReopenAt (zero when closed).
	Room         CircuitState
	RoomRefusals int
	RoomReopenAt time.Time
}

type circuit struct {
	failures int
	reopen   time.Time
	probing  bool
	probe    uint64    // token of the probe in flight
	probeEnd time.Time // while probing: the probe dial's deadline
	lastErr  string
}

// circuits holds every peer's circuit. The claim path consults it under
// the executor's claimMu; dial results arrive from workers.
type circuits struct {
	backoff     func(n int) time.Duration
	dialTimeout time.Duration // how long a probe may take
	// firstBack: the first success reported for a peer counts as the
	// peer coming back (the dial circuit; see dialed).
	firstBack bool

	mu     sync.Mutex
	m      map[string]*circuit
	probes uint64 // probe tokens handed out
}

func newCircuits(p ledger.Policy, dialTimeout time.Duration) *circuits {
	return &circuits{backoff: p.Backoff, dialTimeout: dialTimeout, m: map[string]*circuit{}}
}

// admission is the circuit's verdict on one due record.
type admission struct {
	deferUntil time.Time // non-zero: defer the record to this time
	probe      uint64    // non-zero: the record is the half-open probe, with this token
}

// admit decides, at now, what happens to a due record for peer. A probe
// verdict marks the circuit as probing; the probe ends with its dial
// (dialed) or, if it never dials, with release.
func (cs *circuits) admit(peer string, now time.Time) admission {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[peer]
	switch {
	case c == nil || c.failures == 0:
		return admission{}
	case c.probing:
		// Until the probe's dial deadline, or, sooner, until the circuit
		// would reopen if the probe failed now: a probe that fails at once
		// (connection refused) opens it for backoff(failures+1), and the
		// records must not sit out the rest of a dial timeout (a peer that
		// comes back would go unnoticed for dial_timeout, not
		// relay.backoff.max). One due while the probe still dials meets
		// the circuit again.
		until := c.probeEnd
		if next := now.Add(cs.backoff(c.failures + 1)); next.Before(until) {
			until = next
		}
		if !until.After(now) {
			// The probe outlived its dial deadline (a slow clock, or the
			// dial of a stale-connection retry): wait one more dial timeout.
			until = now.Add(cs.dialTimeout)
		}
		return admission{deferUntil: until}
	case now.Before(c.reopen):
		return admission{deferUntil: c.reopen}
	}
	cs.probes++
	c.probing, c.probe, c.probeEnd = true, cs.probes, now.Add(cs.dialTimeout)
	return admission{probe: c.probe}
}

// release ends probe token if it is still the probe in flight: its claim
// was lost, or it never dialled (segment gone, a pooled connection served
// it, the agent is stopping). The peer's next due record probes instead.
// After the probe's dial has decided, release changes nothing.
func (cs *circuits) release(peer string, token uint64) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.m[peer]; c != nil && c.probing && c.probe == token {
		c.probing = false
	}
}

// dialed records the outcome of a dial to peer at now (for the room
// circuit: of an offer). It reports whether a successful dial closed a
// circuit that was open or half-open, or (with firstBack) is the first
// dial to peer this process made: the peer is back after an outage,
// or may be. A new process does not know the previous one's circuits:
// records deferred under them are released at start (ledger.ReleaseDeferred),
// but the back-off of the attempts that failed under them (the probes) is
// the records' own, and only a successful dial says it need not be waited
// out.
func (cs *circuits) dialed(peer string, now time.Time, err error) (back bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[peer]
	if err == nil {
		if c == nil {
			cs.m[peer] = &circuit{}
			return cs.firstBack
		}
		back = c.failures > 0
		c.failures, c.reopen, c.probing = 0, time.Time{}, false
		return back
	}
	if c == nil {
		c = &circuit{}
		cs.m[peer] = c
	}
	c.lastErr = err.Error()
	if c.failures > 0 && !c.probing && now.Before(c.reopen) {
		return false // already open: this dial started before it opened
	}
	c.failures++
	c.probing = false
	c.reopen = now.Add(cs.backoff(c.failures))
	return false
}

// closed reports whether peer's circuit is closed (dials go ahead).
func (cs *circuits) closed(peer string) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[peer]
	return c == nil || c.failures == 0
}

// reset closes peer's circuit ("" = every peer's), keeping the last error.
func (cs *circuits) reset(peer string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for id, c := range cs.m {
		if peer == "" || id == peer {
			c.failures, c.reopen, c.probing = 0, time.Time{}, false
		}
	}
}

// state reports peer's circuit at now.
func (cs *circuits) state(peer string, now time.Time) Circuit {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := Circuit{Peer: peer, State: CircuitClosed}
	c := cs.m[peer]
	if c == nil {
		out.NotDialed = true
		return out
	}
	out.LastError = c.lastErr
	if c.failures == 0 {
		return out
	}
	out.Failures, out.ReopenAt, out.Probing = c.failures, c.reopen, c.probing
	if c.probing || !now.Before(c.reopen) {
		out.State = CircuitHalfOpen
	} else {
		out.State = CircuitOpen
	}
	return out
}

// ResetCircuits closes the dial and room circuits of peer ("" = every
// peer): the operator says the peer is back (edgectl deadletter retry), or
// the peer itself asked for segments, so records owed to it need not wait
// out the back-off. Records already deferred keep their due time; those
// that come due from now on are dialled and offered.
func (e *Executor) ResetCircuits(peer string) {
	e.circuits.reset(peer)
	e.full.reset(peer)
}

// Circuits reports every known peer's dial and room circuits, ordered by
// peer id.
func (e *Executor) Circuits() []Circuit {
	now := e.cfg.Now()
	ids := e.PeerIDs()
	out := make([]Circuit, 0, len(ids))
	for _, id := range ids {
		c := e.circuits.state(id, now)
		room := e.full.state(id, now)
		c.Room, c.RoomRefusals, c.RoomReopenAt = room.State, room.Failures, room.ReopenAt
		out = append(out, c)
	}
	return out
}
