package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/scheduler/types"

	"github.com/relay-dev/relay/relaycore"
)

// API is the part of the EventBridge Scheduler client the Kicker uses;
// *scheduler.Client implements it.
type API interface {
	CreateSchedule(ctx context.Context, in *awsscheduler.CreateScheduleInput, optFns ...func(*awsscheduler.Options)) (*awsscheduler.CreateScheduleOutput, error)
}

// DefaultMinLead is the default Config.MinLead.
const DefaultMinLead = 5 * time.Second

// ErrInvalidSource means Kick was called with an empty source; nothing was
// sent.
var ErrInvalidSource = errors.New("invalid source partition")

// Config wires a Kicker. Client, Group, TargetARN and RoleARN are required.
type Config struct {
	// Client is the Scheduler client (its own retry settings apply; keep
	// them short, because kicks sit on the enqueue path and are best effort).
	Client API
	// Group is the dedicated schedule group (template.yaml's
	// RelayScheduleGroup); isolating relay schedules makes them easy to
	// list, and lets IAM grant CreateSchedule on this group only.
	Group string
	// TargetARN is the fire function's ARN.
	TargetARN string
	// RoleARN is the role Scheduler assumes to invoke TargetARN.
	RoleARN string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MinLead is how far in the future a schedule must be when sent; dues
	// earlier than now+MinLead are scheduled at now+MinLead. Zero means
	// DefaultMinLead.
	MinLead time.Duration
}

// Stats are a Kicker's counters since it was created.
type Stats struct {
	// Calls counts Kick calls that reached the Scheduler API.
	Calls int64
	// Armed counts schedules created.
	Armed int64
	// Conflicts counts kicks answered with ConflictException: the schedule
	// already existed, so the alarm was already armed.
	Conflicts int64
	// Failures counts kicks that returned an error.
	Failures int64
	// Covered counts kicks sent to no one: a schedule this Kicker created
	// for the source has not run yet and runs at or after the due time
	// asked for, so it is that wake-up already.
	Covered int64
}

// Kicker arms one-time schedules that invoke the fire function. It is safe
// for concurrent use.
type Kicker struct {
	cfg                                        Config
	calls, armed, conflicts, failures, covered atomic.Int64

	mu sync.Mutex
	// pending is, per source, the at() time of the latest schedule this
	// Kicker created for it: until that time the schedule has not run
	// (Scheduler never runs one early), so a kick for a due time at or
	// before it is covered (Kick). Entries past their time are dropped
	// once the map holds maxPending.
	pending map[relaycore.Partition]time.Time
}

// maxPending bounds Kicker.pending: a process that kicks for more sources
// than this within a schedule's lead drops the oldest knowledge and sends
// kicks it could have saved, nothing worse.
const maxPending = 4096

// New checks cfg and returns a Kicker.
func New(cfg Config) (*Kicker, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("new kicker: nil scheduler client")
	case cfg.Group == "":
		return nil, errors.New("new kicker: empty schedule group")
	case cfg.TargetARN == "":
		return nil, errors.New("new kicker: empty target arn")
	case cfg.RoleARN == "":
		return nil, errors.New("new kicker: empty role arn")
	case cfg.MinLead < 0:
		return nil, fmt.Errorf("new kicker: negative min lead %s", cfg.MinLead)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinLead == 0 {
		cfg.MinLead = DefaultMinLead
	}
	return &Kicker{cfg: cfg, pending: map[relaycore.Partition]time.Time{}}, nil
}

// FireInput is the fire function's event, as the schedule delivers it.
type FireInput struct {
	Source string `json:"source"`
}

// Kick arms a one-time schedule that invokes the fire function for source
// at dueMS (unix milliseconds, rounded up to the second because `at()` has
// second resolution and a fire before the due time would find nothing due).
//
// Idempotent: the schedule name depends only on (source, due second), so a
// repeated kick returns nil without creating a second schedule
// (ConflictException). Retrying after any error is safe for the same
// reason. An error means the schedule may or may not exist; callers log and
// count it and rely on the durable alarm and the sweep function.
//
// A kick that a schedule this Kicker created already answers sends
// nothing (Stats.Covered): the schedule's at() time is still ahead, so it
// has not run, and it is not before dueMS, so its run is a wake-up at or
// after the due time. An alarm that drains a source re-arms it due now
// after every alarm; the first re-arm's schedule, at least MinLead ahead,
// covers the ones in the seconds after it, so a draining source costs a
// CreateSchedule every MinLead or so instead of one an alarm.
func (k *Kicker) Kick(ctx context.Context, source relaycore.Partition, dueMS int64) error {
	if source == "" {
		k.failures.Add(1)
		return fmt.Errorf("kick: %w: empty", ErrInvalidSource)
	}
	dueSec := ceilDiv(dueMS, 1000)
	name := ScheduleName(source, dueSec)
	at := time.Unix(dueSec, 0).UTC()
	now := k.cfg.Now()
	if earliest := now.Add(k.cfg.MinLead); at.Before(earliest) {
		at = time.Unix(ceilDiv(earliest.UnixMilli(), 1000), 0).UTC()
	}
	if k.coveredBy(source, time.Unix(dueSec, 0), now) {
		k.covered.Add(1)
		return nil
	}
	input, err := json.Marshal(FireInput{Source: string(source)})
	if err != nil {
		k.failures.Add(1)
		return fmt.Errorf("kick %s: encode input: %w", name, err)
	}
	k.calls.Add(1)
	_, err = k.cfg.Client.CreateSchedule(ctx, &awsscheduler.CreateScheduleInput{
		Name:                       aws.String(name),
		GroupName:                  aws.String(k.cfg.Group),
		ScheduleExpression:         aws.String(AtExpression(at)),
		ScheduleExpressionTimezone: aws.String("UTC"),
		FlexibleTimeWindow:         &types.FlexibleTimeWindow{Mode: types.FlexibleTimeWindowModeOff},
		ActionAfterCompletion:      types.ActionAfterCompletionDelete,
		Target: &types.Target{
			Arn:     aws.String(k.cfg.TargetARN),
			RoleArn: aws.String(k.cfg.RoleARN),
			Input:   aws.String(string(input)),
		},
	})
	var conflict *types.ConflictException
	switch {
	case err == nil:
		k.armed.Add(1)
		k.created(source, at, now)
		return nil
	case errors.As(err, &conflict):
		k.conflicts.Add(1)
		return nil
	default:
		k.failures.Add(1)
		return fmt.Errorf("kick %s: create schedule %s: %w", source, name, err)
	}
}

// coveredBy reports whether the schedule k created last for source, not
// run by now, runs at or after due.
func (k *Kicker) coveredBy(source relaycore.Partition, due, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.pending[source]
	return ok && at.After(now) && !at.Before(due)
}

// created records the schedule k created for source at at. A conflict or
// an error records nothing: whose schedule that is, and when it runs, is
// not known.
func (k *Kicker) created(source relaycore.Partition, at, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if prev, ok := k.pending[source]; ok && prev.After(at) {
		return // a later one is pending: it covers more
	}
	if len(k.pending) >= maxPending {
		for s, t := range k.pending {
			if !t.After(now) {
				delete(k.pending, s)
			}
		}
		if len(k.pending) >= maxPending {
			clear(k.pending)
		}
	}
	k.pending[source] = at
}

// Stats returns a snapshot of the counters.
func (k *Kicker) Stats() Stats {
	return Stats{
		Calls:     k.calls.Load(),
		Armed:     k.armed.Load(),
		Conflicts: k.conflicts.Load(),
		Failures:  k.failures.Load(),
		Covered:   k.covered.Load(),
	}
}

// AtExpression formats t as a Scheduler one-time expression. Sub-second
// parts are dropped; pass a time already rounded as wanted.
func AtExpression(t time.Time) string {
	return "at(" + t.UTC().Format("2006-01-02T15:04:05") + ")"
}

// ceilDiv is a/b rounded towards +inf, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}
