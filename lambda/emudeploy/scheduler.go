package emudeploy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/relay-dev/relay/internal/awsproto"
)

// DefaultPrecision is EventBridge Scheduler's: "All schedule types on
// EventBridge Scheduler invoke their targets with 60 second precision"
// (its user guide, "Schedule types").
const DefaultPrecision = time.Minute

// RunAt is when a one-time schedule at(at) runs: at a uniformly random
// whole second of the precision window that starts at at. The guide's
// example is a minute-resolution time (set for 1:00, it runs between
// 1:00:00 and 1:00:59); for an at() with seconds, as the relay's kicks
// are, the window is taken to start at the time itself, so a schedule
// never runs early: a fire before its alarm is due would find nothing due.
// This is the model docs/deploy.md's "up to ~60 s" states.
func RunAt(at time.Time, precision time.Duration, r *rand.Rand) time.Time {
	secs := int64(precision / time.Second)
	if secs <= 1 {
		return at
	}
	return at.Add(time.Duration(r.Int64N(secs)) * time.Second)
}

// SchedulerStats counts the Scheduler endpoint's work.
type SchedulerStats struct {
	// Requests counts CreateSchedule calls; Created of them armed a
	// schedule, Conflicts found one of the name pending (409, which the
	// relay counts as armed), Invalid broke the relay's contract.
	Requests, Created, Conflicts, Invalid int
	// Runs are one-time schedules that ran: each is a billed Scheduler
	// invocation and one asynchronous invoke of the fire function.
	Runs int
	// Late sums, over the runs, how long after its at() time each ran.
	Late time.Duration
}

// Scheduler is an EventBridge Scheduler endpoint that runs what it is
// given: it speaks CreateSchedule (POST /schedules/{Name}), refuses a name
// already pending (409 ConflictException) and, at RunAt of each accepted
// one-time schedule, deletes it (ActionAfterCompletion DELETE frees the
// name) and hands its input to the target. Requests the relay must never
// send (awsproto.ParseCreateSchedule, the contract schedulertest checks
// too: flexible window on, no delete after completion, not at(), not UTC,
// unsigned, no client token...) are answered 400 and counted as Invalid.
type Scheduler struct {
	clk       Clock
	precision time.Duration
	latency   time.Duration
	target    func(arn string, input []byte)

	mu      sync.Mutex
	rng     *rand.Rand
	pending map[string]bool
	stats   SchedulerStats
	invalid []string
}

// NewScheduler returns a Scheduler whose schedules run target(arn, input)
// at RunAt(at, precision); latency holds each response (the API request's
// round trip); seed seeds the run seconds.
func NewScheduler(clk Clock, precision, latency time.Duration, seed uint64, target func(arn string, input []byte)) *Scheduler {
	return &Scheduler{clk: clk, precision: precision, latency: latency, target: target,
		rng: rand.New(rand.NewPCG(seed, 0x736368)), pending: map[string]bool{}}
}

// Stats returns the counters.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Violations lists the invalid requests seen, each with its reason.
func (s *Scheduler) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.invalid...)
}

// Pending is the number of armed schedules that have not run.
func (s *Scheduler) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// ServeHTTP answers one CreateSchedule request.
func (s *Scheduler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.latency > 0 {
		time.Sleep(s.latency) // the request's round trip, not synchronisation
	}
	sc, problem := awsproto.ParseCreateSchedule(r)
	name := sc.Name
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	switch {
	case problem != "":
		s.stats.Invalid++
		s.invalid = append(s.invalid, problem)
		awsproto.WriteError(w, http.StatusBadRequest, "ValidationException", map[string]string{"Message": problem})
		return
	case s.pending[name]:
		s.stats.Conflicts++
		awsproto.WriteError(w, http.StatusConflict, "ConflictException", map[string]string{"Message": "Schedule " + name + " already exists."})
		return
	}
	s.stats.Created++
	s.pending[name] = true
	run := RunAt(sc.At, s.precision, s.rng)
	s.clk.AfterFunc(max(run.Sub(s.clk.Now()), 0), func() {
		s.mu.Lock()
		delete(s.pending, name)
		s.stats.Runs++
		s.stats.Late += s.clk.Now().Sub(sc.At)
		s.mu.Unlock()
		s.target(sc.TargetARN, []byte(sc.Input))
	})
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"ScheduleArn":"arn:aws:scheduler:us-east-1:123456789012:schedule/%s/%s"}`, sc.Group, name)
}

// Sweep runs a rate schedule: every period from a seeded phase within the
// first period, it hands target the sweep function's event, as the
// template's ScheduleV2 rate(1 minute) does (its input with Scheduler's
// context attributes filled in). It stops when stop is closed.
func Sweep(clk Clock, period time.Duration, seed uint64, stop <-chan struct{}, target func(input []byte)) {
	r := rand.New(rand.NewPCG(seed, 0x737770))
	phase := time.Duration(r.Int64N(int64(period)))
	var n int
	var tick func()
	tick = func() {
		select {
		case <-stop:
			return
		default:
		}
		n++
		in, _ := json.Marshal(map[string]string{
			"scheduled_time": clk.Now().UTC().Truncate(time.Second).Format(time.RFC3339),
			"execution_id":   fmt.Sprintf("emu%013d", n),
		})
		clk.AfterFunc(period, tick)
		target(in)
	}
	clk.AfterFunc(phase, tick)
}
