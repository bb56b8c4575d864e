package bolt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// maxGroup bounds the batches one transaction commits, so a burst does not
// make one commit (and the memory it holds) arbitrarily large.
const maxGroup = 128

// committer merges the Applys that arrive while a commit is under way into
// the next transaction (group commit): bbolt has one writer and each
// commit ends with fsync, so on a busy file (enqueues and fires of several
// sources, as `relay serve` runs them) most of a commit's time is the
// fsync, and batches that waited for it can share the next one. A lone
// Apply commits at once, as before: nothing waits for company.
//
// Each batch of a group is applied in arrival order inside the one
// transaction, its preconditions read after the earlier batches' writes,
// which is the order the writer lock would have given them. A batch whose
// precondition is false writes nothing (apply checks every precondition
// before its first write), so it fails alone and the others commit. Any
// other error inside the transaction rolls the whole group back and every
// batch of it is retried in a transaction of its own, so one bad batch
// never fails another. A failed commit fails every batch that was in it,
// with the same surely-not/maybe-applied rule as a lone commit.
type committer struct {
	db *bbolt.DB

	mu      sync.Mutex
	queue   []*applyReq
	leading bool
	commits int // transactions committed or tried (tests)

	// failed holds the error of the file's latest commit when bbolt's
	// Commit failed (nil after one that succeeded): DB.CommitErr.
	failed atomic.Pointer[error]
}

// settled records the outcome of a transaction whose callback finished.
func (c *committer) settled(err error) {
	if err == nil {
		c.failed.Store(nil)
		return
	}
	c.failed.Store(&err)
}

type applyReq struct {
	ctx context.Context
	s   *Store
	p   relaycore.Partition
	b   relaycore.Batch
	err error
	// wake says, once: true, lead the next group; false, done (err set).
	wake chan bool
}

// apply runs r in the next group and returns its outcome.
func (c *committer) apply(r *applyReq) error {
	r.wake = make(chan bool, 1)
	c.mu.Lock()
	c.queue = append(c.queue, r)
	if c.leading {
		c.mu.Unlock()
		if lead := <-r.wake; !lead {
			return r.err
		}
		c.mu.Lock()
	}
	// Lead: commit what is queued (r among it), hand the lead to the first
	// batch that arrived meanwhile, and return.
	c.leading = true
	n := min(len(c.queue), maxGroup)
	group := c.queue[:n:n]
	c.queue = c.queue[n:]
	c.commits++
	c.mu.Unlock()

	c.commit(group)

	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].wake <- true
	} else {
		c.leading = false
	}
	c.mu.Unlock()
	for _, g := range group {
		if g != r {
			g.wake <- false
		}
	}
	return r.err
}

// commit runs group in one transaction and sets each batch's err.
func (c *committer) commit(group []*applyReq) {
	if len(group) == 1 {
		r := group[0]
		r.err = r.s.applyAlone(r.ctx, r.p, r.b)
		return
	}
	applied := make([]bool, len(group))
	var aborted bool
	committing := false
	err := c.db.Update(func(tx *bbolt.Tx) error {
		for i, r := range group {
			r.err = nil
			// The writer lock may have been a long wait.
			if err := r.ctx.Err(); err != nil {
				r.err = fmt.Errorf("apply %s: %w", r.p, err)
				continue
			}
			if err := r.s.apply(tx, r.p, r.b); err != nil {
				var cf *relaycore.ConditionFailedError
				if errors.As(err, &cf) {
					r.err = cf // nothing of r was written
					continue
				}
				aborted = true
				return err
			}
			applied[i] = true
		}
		committing = true
		return nil
	})
	if committing {
		c.settled(err)
	}
	switch {
	case aborted:
		for _, r := range group {
			r.err = r.s.applyAlone(r.ctx, r.p, r.b)
		}
	case err != nil:
		for i, r := range group {
			if !applied[i] {
				continue // its own refusal stands: it wrote nothing
			}
			r.err = commitError(r.p, err, committing)
		}
	}
}

// commitError maps the error of an Update whose callback finished
// (committing) or did not to Apply's contract.
func commitError(p relaycore.Partition, err error, committing bool) error {
	switch {
	case !committing:
		var cf *relaycore.ConditionFailedError
		if errors.As(err, &cf) {
			return cf
		}
		return fmt.Errorf("apply %s: %w", p, err)
	case errors.Is(err, berrors.ErrMaxSizeReached):
		return fmt.Errorf("apply %s: %w", p, err)
	default:
		return fmt.Errorf("apply %s: commit: %w: %w", p, relaycore.ErrMaybeApplied, err)
	}
}
