// Package wire is the edge agent's framed protocol (docs/wire.md).
//
// Every frame is
//
//	type (1 byte) · length (4 bytes, big-endian) · payload (length bytes)
//
// and a receiver checks length against its limit before it allocates or
// reads a single payload byte, so a hostile or confused peer cannot make it
// buffer more than the limit. Control frames (HELLO, OFFER, ACK, NACK) are
// small and read whole, up to MaxControlPayload; SEGMENT frames carry the
// segment bytes and are always streamed (WriteSegment, PayloadReader), never
// held in memory.
//
// The protocol version is negotiated in the TLS handshake (ALPN "relay/5",
// "relay/4", "relay/3", "relay/2"; none means version 1), and HELLO repeats it. In version 1 one connection
// carries, after one HELLO each way, any number of exchanges in sequence:
//
//	sender:   OFFER, SEGMENT            (back to back)
//	receiver: ACK   once the segment is durably stored
//	      or  NACK  with a code; nothing stored
//
// In version 2 (pipeline.go) the sender keeps up to the receiver's window
// (announced in its HELLO) of offers unanswered; each OFFER is answered
// ACCEPT, ACK (already held: nothing is sent) or NACK before any byte of
// it moves, SEGMENTs follow in ACCEPT order, and the final ACK or NACK of
// each comes in any order, matched by segment id (Conn.DeliverWindow,
// Conn.RecvRequest). Version 3 adds WANT (Conn.Want): a node asks for
// segments it acknowledged and then lost, answered by HOLDS.
//
// Conn wraps a net.Conn with one method per step. Its methods take a
// context whose deadline and cancellation are applied to the underlying
// connection, and an optional idle timeout bounds every single read or write
// so a stalled peer cannot pin a transfer forever.
//
// Messages are decoded strictly: exactly the documented JSON keys (matched
// case-sensitively, no duplicates, no unknown keys, no null values, no
// trailing data), identifiers restricted to a small alphabet (CheckSegmentID,
// CheckNodeID) because segment ids become file names on the receiver.
package wire
