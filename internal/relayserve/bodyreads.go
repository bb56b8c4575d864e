package relayserve

import (
	"net/http"
	"sync"
	"time"
)

// bodyReads are the requests whose bodies are being read. A drain gives
// them the first half of drain_timeout to arrive, then cuts them: a
// client still sending (a large body on a slow link) finishes and is
// served, while a stalled or trickling one (within limits.read_timeout,
// 60 s by default) cannot hold the shutdown until drain_timeout and make
// it a forced one. Cutting a read loses nothing: nothing of a request is
// written before its whole body has arrived. The second half of the drain
// is left for the handlers of the bodies that did arrive.
type bodyReads struct {
	mu     sync.Mutex
	cutoff time.Time // zero until the drain
	active map[*http.ResponseController]struct{}
}

// start registers a read about to begin (during a drain it gets the
// cutoff as its read deadline).
func (b *bodyReads) start(rc *http.ResponseController) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cutoff.IsZero() {
		rc.SetReadDeadline(b.cutoff)
	}
	if b.active == nil {
		b.active = map[*http.ResponseController]struct{}{}
	}
	b.active[rc] = struct{}{}
}

// done unregisters a read and reports whether a drain had begun.
func (b *bodyReads) done(rc *http.ResponseController) (draining bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.active, rc)
	return !b.cutoff.IsZero()
}

// drain gives the reads in progress, and those to come, until cutoff.
// The deadline only ever moves earlier than limits.read_timeout's: a
// connection's deadline is absolute, and cutoff is within drain_timeout.
func (b *bodyReads) drain(cutoff time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cutoff = cutoff
	for rc := range b.active {
		rc.SetReadDeadline(cutoff) // an error means the connection is gone: its read ends anyway
	}
}
