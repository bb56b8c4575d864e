package relaycore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// Lease is a source's single-writer lease, stored as the source's lease
// record. Enqueue batches of a lease holder carry a precondition on the
// whole record, so a holder whose lease was taken over, renewed by someone
// else or released fails closed with ErrStaleLease.
type Lease struct {
	Holder    string `json:"holder"`
	Epoch     uint64 `json:"epoch"`
	ExpiresMS int64  `json:"expires_ms"`
}

func (l Lease) encode() []byte { return encodeJSON(l) }

func readLease(ctx context.Context, st Store, source Partition) (*Lease, []byte, error) {
	raw, found, err := st.Get(ctx, source, layout.KeyLease)
	if err != nil {
		return nil, nil, fmt.Errorf("read lease %s: %w", source, err)
	}
	if !found {
		return nil, nil, nil
	}
	return decodeLease(raw)
}

func decodeLease(raw []byte) (*Lease, []byte, error) {
	var l Lease
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, nil, fmt.Errorf("%w: lease %q", ErrCorruptRecord, raw)
	}
	return &l, raw, nil
}

// AcquireLease takes the source's lease for holder until now+ttl. It fails
// with ErrLeaseHeld while another holder's lease is live. Every acquisition
// bumps the epoch, so any older Lease value (even the same holder's) turns
// stale. The write is a compare-and-set on the lease record.
func AcquireLease(ctx context.Context, st Store, source Partition, holder string, ttl time.Duration, now time.Time) (Lease, error) {
	if holder == "" || ttl <= 0 {
		return Lease{}, fmt.Errorf("acquire lease %s: holder and a positive ttl are required", source)
	}
	if !utf8.ValidString(holder) {
		// JSON would store it altered, and the returned lease would never
		// match its own record (every enqueue with it would fail as stale).
		return Lease{}, fmt.Errorf("acquire lease %s: holder %q is not valid UTF-8", source, holder)
	}
	cur, raw, err := readLease(ctx, st, source)
	if err != nil {
		return Lease{}, err
	}
	pre := Precondition{Key: layout.KeyLease, Absent: true}
	next := Lease{Holder: holder, Epoch: 1, ExpiresMS: unixMS(now.Add(ttl))}
	if cur != nil {
		if cur.Holder != holder && cur.ExpiresMS > unixMS(now) {
			return Lease{}, fmt.Errorf("acquire lease %s: %w (holder %q until %d)", source, ErrLeaseHeld, cur.Holder, cur.ExpiresMS)
		}
		pre = Precondition{Key: layout.KeyLease, Value: raw}
		next.Epoch = cur.Epoch + 1
	}
	err = st.Apply(ctx, source, Batch{Preconditions: []Precondition{pre}, Writes: []Write{{Key: layout.KeyLease, Value: next.encode()}}})
	if err != nil {
		if _, ok := FailedPrecondition(err); ok {
			return Lease{}, fmt.Errorf("acquire lease %s: %w (raced)", source, ErrLeaseHeld)
		}
		return Lease{}, fmt.Errorf("acquire lease %s: %w", source, err)
	}
	return next, nil
}

// RenewLease extends a live lease to now+ttl, keeping its epoch. It fails
// with ErrStaleLease when the record no longer equals l or l has expired.
func RenewLease(ctx context.Context, st Store, source Partition, l Lease, ttl time.Duration, now time.Time) (Lease, error) {
	if l.ExpiresMS <= unixMS(now) {
		return Lease{}, fmt.Errorf("renew lease %s: %w (expired)", source, ErrStaleLease)
	}
	next := Lease{Holder: l.Holder, Epoch: l.Epoch, ExpiresMS: unixMS(now.Add(ttl))}
	err := st.Apply(ctx, source, Batch{
		Preconditions: []Precondition{{Key: layout.KeyLease, Value: l.encode()}},
		Writes:        []Write{{Key: layout.KeyLease, Value: next.encode()}},
	})
	if err != nil {
		if _, ok := FailedPrecondition(err); ok {
			return Lease{}, fmt.Errorf("renew lease %s: %w", source, ErrStaleLease)
		}
		return Lease{}, fmt.Errorf("renew lease %s: %w", source, err)
	}
	return next, nil
}

// ReleaseLease deletes the lease record if it still equals l. Releasing a
// lease that was already taken over reports ErrStaleLease and changes nothing.
func ReleaseLease(ctx context.Context, st Store, source Partition, l Lease) error {
	err := st.Apply(ctx, source, Batch{
		Preconditions: []Precondition{{Key: layout.KeyLease, Value: l.encode()}},
		Writes:        []Write{{Key: layout.KeyLease, Delete: true}},
	})
	if err != nil {
		if _, ok := FailedPrecondition(err); ok {
			return fmt.Errorf("release lease %s: %w", source, ErrStaleLease)
		}
		return fmt.Errorf("release lease %s: %w", source, err)
	}
	return nil
}

// DeclareLeaseRequired marks the source lease-required in its os record (the
// seed's "D34 ref shard"): from then on enqueue without a lease fails with
// ErrLeaseRequired. Idempotent; it is a compare-and-set on os, retried on
// races with enqueuers.
func DeclareLeaseRequired(ctx context.Context, st Store, source Partition) error {
	for attempt := 0; ; attempt++ {
		raw, found, err := st.Get(ctx, source, KeyOS)
		if err != nil {
			return fmt.Errorf("declare lease required %s: %w", source, err)
		}
		os, err := decodeOS(raw, found)
		if err != nil {
			return fmt.Errorf("declare lease required %s: %w", source, err)
		}
		if os.LeaseRequired {
			return nil
		}
		os.LeaseRequired = true
		os.Version++
		next := encodeJSON(os)
		err = st.Apply(ctx, source, Batch{Preconditions: []Precondition{osGuard(raw, found)}, Writes: []Write{{Key: KeyOS, Value: next}}})
		if err == nil {
			return nil
		}
		if MayBeApplied(err) {
			cur, ok, rerr := st.Get(ctx, source, KeyOS)
			if rerr == nil && ok && bytes.Equal(cur, next) {
				return nil
			}
		}
		if _, ok := FailedPrecondition(err); (ok || MayBeApplied(err)) && attempt < 16 {
			continue
		}
		return fmt.Errorf("declare lease required %s: %w", source, err)
	}
}

func osGuard(raw []byte, found bool) Precondition {
	if !found {
		return Precondition{Key: KeyOS, Absent: true}
	}
	return Precondition{Key: KeyOS, Value: raw}
}
