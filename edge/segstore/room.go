package segstore

import (
	"errors"
	"fmt"
	"io"
	"syscall"
)

// A full store: the quota is reached, or the disk itself ran out of space
// before the quota did (the quota is a promise about edged's share, not a
// reservation of blocks).
//
// Either way the offer is refused with ErrQuota (the receiver NACKs
// quota; the sender retries after its back-off), unless Options.MakeRoom
// is set (storage.on_full: evict_relayed_oldest): then Reserve first asks
// it to free the shortfall and tries once more, and a write that failed
// because the disk was full asks it to free the segment's size, so the
// sender's retry finds room. The Store does not decide what may go: the
// daemon's MakeRoom evicts only relayed segments whose ledger gate allows
// it (relay.Executor.MakeRoom).

// makeRoom asks Options.MakeRoom for what a reservation of size lacks.
// It runs without s.mu: MakeRoom evicts through EvictIf.
func (s *Store) makeRoom(size int64) {
	s.mu.Lock()
	bytes := s.bytes + s.resBytes + size - s.opt.QuotaBytes
	segs := s.count + s.resCount + 1 - s.opt.QuotaSegments
	s.mu.Unlock()
	s.opt.MakeRoom(max(0, bytes), max(0, segs))
}

// diskFull rewrites a commit failure caused by the file system running
// out of space (ENOSPC, or EDQUOT: a disk quota) as ErrQuota, which the
// receiver NACKs as quota, and with MakeRoom asks for the segment's size
// to be freed. The commit path has already removed what the attempt
// wrote, so the store is as it was before the offer.
func (s *Store) diskFull(err error, size int64) error {
	if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
		return err
	}
	if s.opt.MakeRoom != nil {
		s.opt.MakeRoom(size, 0)
	}
	return fmt.Errorf("%w: disk full: %w", ErrQuota, err)
}

// tempWriter is what the commit path writes a segment's content to: the
// temp file, or Options.WrapTemp's wrapper of it (fault injection).
func (s *Store) tempWriter(id string, w io.Writer) io.Writer {
	if s.opt.WrapTemp == nil {
		return w
	}
	return s.opt.WrapTemp(id, w)
}
