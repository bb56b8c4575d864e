package relay

import (
	"errors"
	"log/slog"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/wire"
)

// A receiver that is still taking in another copy of a segment (another
// peer offering it at the same time, or this sender's own earlier attempt
// still arriving on a slow link after its ACK timed out here) refuses the
// offer with NACK busy (wire version 5). Nothing is wrong with the
// segment, this node or the peer, and the other copy will most likely be
// stored: counted as a failed attempt, such refusals deadlettered records
// whose segment the peer went on to store. So the record is postponed
// (ledger.Postpone: the attempt counts in Attempts, not in the retry
// budget), due again after Policy.Backoff of its postponements so far;
// the next offer is then ACKed (already held) if the other copy was
// stored, or sent if it was not. Unlike a refusal for room (full.go) the
// peer's other records are not held back. A receiver that speaks version
// 4 or lower is told quota instead, which it postpones as for room.

// refusedBusy reports whether err is a peer's NACK busy.
func refusedBusy(err error) bool {
	var ne *wire.NackError
	return errors.As(err, &ne) && ne.Nack.Code == wire.NackBusy
}

// postponeBusy records an attempt refused because the peer is taking in
// another copy of the segment: due again later, its retry budget
// untouched.
func (e *Executor) postponeBusy(rec ledger.Record, err error, elapsed time.Duration) {
	now := e.cfg.Now()
	// rec.BudgetBase counts the record's postponed attempts before this
	// one: each further refusal waits twice as long, up to backoff.max.
	until := now.Add(e.cfg.Policy.Backoff(rec.BudgetBase + 1))
	e.postponeTo(rec, err, elapsed, until, now, slog.LevelInfo,
		"relay attempt refused: the peer is taking in another copy of the segment; postponed, retry budget kept")
}
