package relaycore

import (
	"context"
	"time"
)

// Clock tells the engine the time. Enqueue stamps commit times and checks
// deadlines with it; fires use it for claims and back-off. Tests and the
// simulation supply a controllable clock; production uses SystemClock.
type Clock interface{ Now() time.Time }

// SystemClock is the wall clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// Kicker is the fast-path alarm: after rows commit (or a fire re-arms, or an
// alarm meets another holder's claim and wants to try again when it lapses),
// the engine asks it to wake the source's fire at dueMS (unix milliseconds).
// It is best effort: the durable alarm record written in the same batch as
// the rows is what guarantees the wake-up, and a sweeper fires overdue alarm
// records. Implementations should make duplicate kicks for one
// (source, dueMS) collapse; an error is logged and never fails the caller.
// The engine bounds each call to 3 s (its context's deadline).
type Kicker interface {
	Kick(ctx context.Context, source Partition, dueMS int64) error
}

// kickTimeout bounds one Kicker.Kick call (its context's deadline): a kick
// runs after the rows it wakes are committed, so a kicker whose service
// hangs must not hold the enqueue's answer until the caller gives up and
// retries rows that did commit. A kick cut short is logged like a failed
// one; the durable alarm and the sweep still wake the source.
const kickTimeout = 3 * time.Second

// kickBounded calls k with its context bounded by kickTimeout.
func kickBounded(ctx context.Context, k Kicker, source Partition, dueMS int64) error {
	ctx, cancel := context.WithTimeout(ctx, kickTimeout)
	defer cancel()
	return k.Kick(ctx, source, dueMS)
}

func unixMS(t time.Time) int64 { return t.UnixMilli() }
