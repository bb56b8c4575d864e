package relayserve

import (
	"context"
	"sync"
)

// sourceLocks let the enqueues of one source take turns in this process.
//
// The server is alone on its file, so a source's os record is written by
// its enqueues and its fires only. Enqueues that run at once race on that
// record's compare-and-set, and of those in one group commit only one can
// win; the rest re-plan, up to RelayHandler.MaxReplans (64) times before
// answering 503 unavailable. 300 enqueues at once to one source ran 138
// of them out of re-plans. Taking turns commits as many enqueues of a
// source per commit as racing did (one), spends no re-plans, and leaves
// the races to the rare fire that writes os, which the re-plans absorb.
// Enqueues to different sources do not wait for each other and still
// share the file's group commit.
type sourceLocks struct {
	mu sync.Mutex
	m  map[string]*sourceLock
}

type sourceLock struct {
	turn chan struct{} // holds one token while an enqueue runs
	refs int           // holders and waiters; the entry goes at zero
}

// lock waits for source's turn, or for ctx to end (the client went away:
// nothing was written). unlock passes the turn on.
func (l *sourceLocks) lock(ctx context.Context, source string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sourceLock{}
	}
	e := l.m[source]
	if e == nil {
		e = &sourceLock{turn: make(chan struct{}, 1)}
		l.m[source] = e
	}
	e.refs++
	l.mu.Unlock()
	select {
	case e.turn <- struct{}{}:
		return func() { <-e.turn; l.release(source, e) }, nil
	case <-ctx.Done():
		l.release(source, e)
		return nil, ctx.Err()
	}
}

func (l *sourceLocks) release(source string, e *sourceLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(l.m, source)
	}
}
