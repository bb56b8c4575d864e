// Package scheduler arms the relay's fast-path wake-up: after a batch of
// relay rows commits, a Kicker creates a one-time EventBridge Scheduler
// schedule that invokes the fire function for that source at the alarm's
// due time (docs/engine.md, "Wake-ups: three layers", layer 2).
//
// The schedule is `at(yyyy-mm-ddThh:mm:ss)` in UTC, in a dedicated schedule
// group, with FlexibleTimeWindow OFF and ActionAfterCompletion DELETE, so
// completed schedules do not count against the account's schedule quota.
// Its name is derived from (source, due second) only, which makes a kick
// idempotent: a second kick for the same alarm gets ConflictException from
// Scheduler, which the Kicker reports as success ("already armed").
//
// A Kicker remembers, per source, the at() time of the last schedule it
// created, and sends nothing for a kick whose due time is not after it
// while that time is still ahead (Stats.Covered): the pending schedule
// runs at or after the due time, so it already is the wake-up asked for.
// A fire function draining a source re-arms it due now after every alarm;
// without this each alarm made a CreateSchedule call, with it one does every
// MinLead or so.
//
// Kicks are best effort. The durable alarm record, written in the same
// batch as the rows, is what guarantees the wake-up; the sweep function
// fires overdue durable alarms every minute. So a failed kick costs latency
// (bounded by RELAY_LAG_BOUND_MS), never a row. Kick still returns its
// error, so the caller can log it; it must not turn it into a failed
// enqueue. Counters (Stats) let operators see how often kicks fail.
//
// Past dues: the Scheduler documentation does not say what a one-time
// schedule whose time has already passed does (reports range from a
// validation error to a schedule that never runs), so the Kicker never
// sends one. A due at or before now+MinLead is scheduled at now+MinLead.
// The name still uses the original due, so repeated kicks for one overdue
// alarm collapse into one schedule.
package scheduler
