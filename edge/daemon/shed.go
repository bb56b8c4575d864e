package daemon

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/transport"
)

// shedReason names why the listener gave up an unauthenticated
// connection before its handshake finished (transport's admission), for
// edged_inbound_handshakes_shed_total{reason}.
func shedReason(err error) (string, bool) {
	switch {
	case errors.Is(err, transport.ErrAddressBusy):
		return "address_limit", true
	case errors.Is(err, transport.ErrHandshakeEvicted):
		return "evicted", true
	}
	return "", false
}

// shedLogEvery bounds how often shed connections are logged: under a
// flood they come by the thousand per second, and a line each would turn
// the flood into a disk-filling one.
const shedLogEvery = 10 * time.Second

// shedLog summarises shed connections in at most one warning per
// shedLogEvery.
type shedLog struct {
	mu     sync.Mutex
	last   time.Time
	counts map[string]int
}

func (s *shedLog) note(log *slog.Logger, remote net.Addr, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[reason]++
	now := time.Now()
	if now.Sub(s.last) < shedLogEvery {
		return
	}
	log.Warn("inbound connections shed before their TLS handshake finished (a flood of unauthenticated connections?)",
		"address_limit", s.counts["address_limit"], "evicted", s.counts["evicted"], "last_remote", addrString(remote),
		"since", s.last.Format(time.RFC3339))
	s.last = now
	clear(s.counts)
}
