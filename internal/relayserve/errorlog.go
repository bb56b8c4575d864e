package relayserve

import (
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// handshakeSummaryEvery bounds the log lines about failed TLS handshakes:
// at most one per this period.
const handshakeSummaryEvery = time.Minute

// newServerErrorLog is the http.Server's ErrorLog. Most of what the
// server logs there is rare and logged as it comes, at WARN. A failed TLS
// handshake is not: anyone who can connect causes one (a scanner, a
// client of the wrong CA, a port probe), so one line each would let
// unauthenticated clients write the log (one run wrote 610 lines). Those
// are counted (relay_tls_handshake_errors_total, onHandshakeError) and
// summarised: the first is logged at once, the rest at most once per
// handshakeSummaryEvery, each line with the count since the last one and
// the latest failure's remote address and error.
func newServerErrorLog(l *slog.Logger, onHandshakeError func(), now func() time.Time) *log.Logger {
	return log.New(&serverErrorWriter{log: l, onHandshake: onHandshakeError, now: now}, "", 0)
}

type serverErrorWriter struct {
	log         *slog.Logger
	onHandshake func()
	now         func() time.Time

	mu         sync.Mutex
	lastLine   time.Time // of the last summary; zero: none yet
	suppressed int       // failures since then
}

func (w *serverErrorWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	rest, ok := strings.CutPrefix(msg, "http: TLS handshake error from ")
	if !ok {
		w.log.Warn(msg)
		return len(p), nil
	}
	w.onHandshake()
	remote, err, _ := strings.Cut(rest, ": ")
	w.mu.Lock()
	w.suppressed++
	now := w.now()
	if !w.lastLine.IsZero() && now.Sub(w.lastLine) < handshakeSummaryEvery {
		w.mu.Unlock()
		return len(p), nil
	}
	n := w.suppressed
	w.lastLine, w.suppressed = now, 0
	w.mu.Unlock()
	w.log.Warn("relay serve: TLS handshakes failed", "count", n, "last_remote", remote, "last_err", err,
		"next_summary_after", handshakeSummaryEvery.String())
	return len(p), nil
}
