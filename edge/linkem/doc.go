// Package linkem emulates a slow, lossy network link between two programs on
// loopback, in user space, for tests and benchmarks of the edge agent (the
// kernels this project is tested on have no netem).
//
// A [Link] listens on 127.0.0.1:0 and, for every connection accepted there,
// dials [Config.Target] and forwards bytes both ways. Up is client → target,
// Down is target → client.
//
// # Model
//
// Each direction of the link is modelled on its own, with the same settings:
//
//   - Bandwidth is a serialization delay, not a token bucket: a chunk of n
//     bytes read from the sender occupies the direction's transmitter for
//     n·8/Bandwidth seconds, starting when the chunk was read or when the
//     previous chunk finished, whichever is later. A token bucket would let a
//     burst up to its bucket size through at once, so short exchanges would
//     beat the configured rate; serialization has no burst and so no extra
//     parameter. The transmitter is shared by all connections of the link
//     (they compete for the bandwidth, as on a real link).
//   - Latency is one-way propagation delay: a chunk is written to the
//     receiver no earlier than Latency after its serialization finished, so
//     every byte is delivered no earlier than Latency after it was sent (read
//     by the proxy). Chunks are at most 16 KiB (1.3 ms at 100 Mbit/s), so the
//     granularity this adds is small against realistic latencies.
//   - Buffer, when positive, bounds the bytes per connection and direction
//     that the proxy has read but not yet written: at the bound the proxy
//     stops reading, the kernel's socket buffers fill, and the sender blocks
//     (back-pressure, as a receive window gives). With a bound below
//     Latency × Bandwidth the throughput is capped near Buffer/Latency, as a
//     window-limited TCP connection's is. Zero means no bound: the proxy reads
//     whatever the sender writes and holds it in memory.
//
// The kernel's own socket buffers on both loopback sockets add to what is in
// flight; they do not add delay.
//
// Byte order within a direction is always preserved; bytes are never
// dropped, reordered or corrupted (TCP would hide that anyway): the faults
// are what TCP exposes to the application.
//
// # Faults
//
// Faults are triggered by the test, deterministically: by a method call, or
// by [Link.After] once an exact number of bytes has been delivered in a
// direction. There are no timers and no randomness.
//
//   - [Link.Stall] closes the gate: nothing more is written to either end
//     (data keeps being read up to Buffer, and waits) until [Link.Resume].
//     Connections stay open; new ones are still accepted and dialled.
//   - [Link.Reset] aborts every current connection with a TCP RST to both
//     ends (SO_LINGER 0): both ends see ECONNRESET (or EPIPE on write), and
//     bytes still queued in the proxy are lost.
//   - [Link.Drop] closes every current connection on both ends: a FIN, so a
//     reader sees EOF before the bytes it expected (Linux sends an RST
//     instead if the proxy's socket still holds unread data from that end).
//
// New connections are accepted after Reset and Drop, as after a real link
// failure the peers reconnect.
//
// [Link.Stats] and [Link.WaitStats] expose byte counters, so a test can wait
// for a state ("the proxy holds all 10 bytes at the stalled gate") instead of
// sleeping.
//
// Close stops the listener and every goroutine of the link; it closes all
// connections.
package linkem
