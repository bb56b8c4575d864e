package relay

import (
	"errors"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
)

// A peer that took a segment down (NACK evicted, wire version 4) keeps a
// tombstone of it and will never store it: offering it again is useless
// and would hold the record in the retry budget until it deadlettered,
// reported as a failure although nothing failed. So the attempt's record
// is cancelled (ledger.Cancel): terminal, not retried, not deadlettered,
// counted as the attempt outcome "cancelled". A peer older than version 4
// cannot say so: it answers bad_request, which is a failed attempt.
//
// On the node that takes a segment down, its records are cancelled in the
// takedown's own transaction (ledger.CancelSegmentIn); an attempt in flight
// then finds its record cancelled and records nothing (finish, failed).

// refusedEvicted reports whether err is a peer's NACK evicted.
func refusedEvicted(err error) bool {
	var ne *wire.NackError
	return errors.As(err, &ne) && ne.Nack.Code == wire.NackEvicted
}

// cancelledMeanwhile reports whether a ledger transition failed because
// the record had been cancelled (a takedown here) while its attempt ran.
func cancelledMeanwhile(err error) bool {
	var te *ledger.TransitionError
	return errors.As(err, &te) && te.From == ledger.StateCancelled
}

// cancel records a peer's refusal of a segment it took down.
func (e *Executor) cancel(rec ledger.Record, err error, elapsed time.Duration) {
	log := e.log.With("segment", rec.SegmentID, "peer", rec.PeerID, "attempt", rec.Attempts)
	if _, cerr := e.led.Cancel(rec.SegmentID, rec.PeerID, err, e.cfg.Now()); cerr != nil {
		if cancelledMeanwhile(cerr) {
			return
		}
		log.Error("relay refusal not recorded", "err", err, "record_err", cerr)
		return
	}
	e.observe(rec.PeerID, "cancelled", 0, elapsed)
	log.Info("relay cancelled: the peer took the segment down and refuses it for good", "err", err)
	// A cancelled peer no longer holds back eviction under one_peer.
	e.checkSuccessCondition(rec.SegmentID)
}
