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
type Kicker interface {
	Kick(ctx context.Context, source Partition, dueMS int64) error
}

func unixMS(t time.Time) int64 { return t.UnixMilli() }
