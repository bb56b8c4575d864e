package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
)

// A peer that refuses a segment for want of room (NACK quota: its quota or
// its disk is full) is not a broken segment, and its refusal is not a
// failed attempt. Counted as one, a full receiver deadlettered every
// record owed to it after max_retries rounds (about 13 minutes with the
// default back-off), and each due record was offered and refused in turn
// (12,932 offers in 40 s with a high max_retries).
//
// So the peer has a second circuit, the room circuit, run like the dial
// circuit (circuit.go) with the same back-off: a refusal for room opens it
// for Policy.Backoff(n) of the n-th consecutive refusing round; the
// refused record is postponed to the reopen time without spending its
// retry budget (ledger.Postpone: the attempt counts in Attempts, not in
// the budget); while the circuit is open the peer's due records are
// deferred like those of an unreachable peer, and a stream to the peer
// claims no more; at the reopen time one record is the probe, offered on
// its own. An ACK from the peer closes the circuit and makes its backlog
// due at once. A full peer is thus asked once per round, at most once per
// backoff.max, for as long as it stays full, and nothing is deadlettered
// for want of room alone. Refusals that arrive together (a window in
// flight when the peer filled up) count as one round.

// refusedForRoom reports whether err is the peer's refusal for want of
// room.
func refusedForRoom(err error) bool {
	var ne *wire.NackError
	return errors.As(err, &ne) && ne.Nack.Code == wire.NackQuota
}

// refused opens (or keeps open) peer's room circuit after a refusal for
// room at now.
func (e *Executor) refused(peer string, now time.Time, err error) {
	e.full.dialed(peer, now, err)
}

// roomOK records an ACK from peer: the room circuit closes, and if it was
// open what is owed to the peer is due now.
func (e *Executor) roomOK(peer string) {
	if e.full.dialed(peer, e.cfg.Now(), nil) {
		e.backlogDue(peer, "has room again")
	}
}

// postpone records an attempt refused for room: due again when the
// peer's room circuit half-opens, its retry budget untouched.
func (e *Executor) postpone(rec ledger.Record, err error, elapsed time.Duration) {
	now := e.cfg.Now()
	e.refused(rec.PeerID, now, err)
	until := e.full.state(rec.PeerID, now).ReopenAt
	if until.Before(now) {
		until = now // closed meanwhile by an ACK: the peer has room
	}
	e.postponeTo(rec, err, elapsed, until, now, slog.LevelWarn, "relay attempt refused for want of room: postponed, retry budget kept")
}

// postponeTo records an attempt refused for a reason that is no failure
// of the peer's or the segment's (room, another copy arriving): due again
// at until, its retry budget untouched (ledger.Postpone), logged at level
// with msg. A record cancelled meanwhile (a takedown) stays cancelled.
func (e *Executor) postponeTo(rec ledger.Record, err error, elapsed time.Duration, until, now time.Time, level slog.Level, msg string) {
	log := e.log.With("segment", rec.SegmentID, "peer", rec.PeerID, "attempt", rec.Attempts)
	if _, perr := e.led.Postpone(rec.SegmentID, rec.PeerID, err, until, now); perr != nil {
		if !cancelledMeanwhile(perr) {
			log.Error("relay refusal not recorded", "err", err, "record_err", perr)
		}
		return
	}
	e.observe(rec.PeerID, "postponed", 0, elapsed)
	log.Log(context.Background(), level, msg, "err", err, "next_attempt", until)
}
