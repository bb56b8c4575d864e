package emudeploy

import "time"

// Clock is the time the emulated services keep: when a schedule runs, when
// a queued event is taken, when the sweep ticks. The bootstraps keep their
// own (the system clock); a Deployment uses SystemClock, and the model
// tests a manual clock, so what is modelled can be checked without waiting.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func())
}

// SystemClock is wall time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }
