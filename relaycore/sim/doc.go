// Package sim is the deterministic simulation of the relay engine: several
// sources, targets and concurrent writers, duplicate and overlapping fires,
// os CAS races, transient and permanent target failures, lease expiry,
// clock skew and crashes between any two store calls — all driven by one
// seed, with the engine's invariants checked after every store call and at
// quiescence.
//
// # How it runs
//
// Every simulated process (writer, lease holder, alarm, fire, drainer) is
// an actor: a goroutine running real engine code (RelayHandler.Enqueue, Alarm,
// Fire, AcquireLease, ...) against a gate, a relaycore.Store that parks
// the actor before every Get, Scan and Apply. The scheduler lets exactly
// one actor run at a time: it picks a parked actor with a seeded PCG,
// performs that actor's store call on the raw store itself (or answers it
// with an injected failure, or kills the actor before or after it), checks
// the invariants by reading the raw stores directly, and resumes the actor
// until it parks again. So the interleaving is a pure function of the seed;
// only the engine's random nonces differ between runs, and the engine
// compares those only for equality.
//
// Time is simulated: the scheduler advances one clock, each actor reads it
// through its own skew, sleeping actors wake when it reaches them, and when
// nothing can run the clock jumps to the next wake-up.
//
// A crash is process death: runtime.Goexit from the gate, after which the
// actor never runs again and nothing it knew survives; a crashed writer's
// remaining workload is later taken up by a fresh writer, a crashed fire
// is replaced by the sweeper's next pass over the durable alarms.
//
// docs/simulation.md lists the invariants and how to reproduce a seed.
package sim
