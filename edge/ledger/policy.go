package ledger

import (
	"fmt"
	"time"
)

// Policy is the retry budget applied by TransitionFailed and
// InflightToFailed; the daemon builds it from relay.max_retries and
// relay.backoff.
type Policy struct {
	// MaxRetries is the number of failed attempts per budget after which a
	// record is deadlettered (≥ 1).
	MaxRetries int
	// Initial is the wait after the first failed attempt (> 0).
	Initial time.Duration
	// Max caps the wait (≥ Initial).
	Max time.Duration
}

// Validate reports a policy that would make back-off meaningless.
func (p Policy) Validate() error {
	if p.MaxRetries < 1 || p.Initial <= 0 || p.Max < p.Initial {
		return fmt.Errorf("%w: %+v", ErrInvalidPolicy, p)
	}
	return nil
}

// Backoff is the wait after the n-th failed attempt of a budget (n ≥ 1):
// min(Max, Initial·2^(n-1)), computed without overflow. No jitter: the
// relay path is deterministic.
func (p Policy) Backoff(n int) time.Duration {
	d := p.Initial
	for i := 1; i < n; i++ {
		if d >= p.Max/2 {
			return p.Max
		}
		d *= 2
	}
	return min(d, p.Max)
}
