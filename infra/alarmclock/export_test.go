package alarmclock

import "context"

// SweepNow runs one sweep, as Run does every SweepInterval.
func (c *Clock) SweepNow(ctx context.Context) { c.sweep(ctx) }

// RunNext runs the earliest wake-up due at the clock's time, on the
// calling goroutine, as one of Run's workers would; false when none is
// due. Tests step several clocks with it on manual time.
func (c *Clock) RunNext(ctx context.Context) bool {
	w, _, ok := c.popDue(c.nowMS())
	if ok {
		c.runAlarm(ctx, w.source, w.pend)
	}
	return ok
}
