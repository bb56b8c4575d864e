package segstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Segments received at the same time (several connections,
// or a pipelined connection's window) each need a rename, a directory
// fsync and an index entry. One after the other that is a directory fsync
// and a bbolt commit (two fsyncs) per segment; here every segment ready
// while a group is being committed joins the next group, which renames
// all of them, fsyncs the directory once and writes every index entry in
// one bbolt transaction. Where syncfs reports writeback errors (Linux
// 5.8+, fssync_linux.go) the files are not fsynced one by one either:
// one syncfs before the renames makes the content of all of them durable,
// so a group of n small segments costs a syncfs, a directory fsync and a
// bbolt commit instead of n+1 fsyncs and a commit. There
// is no timer: a lone segment commits at once, so a group never waits
// for company.
//
// The order of the steps and the crash rules are those of a single write:
// a crash after the renames and before the index commit leaves files
// without entries, which the start-up scan removes as orphans; no caller
// has been told the segment is stored, so no ACK was sent for it.
//
// Leadership: the first caller to find no group in progress commits the
// queue (its own request included) and, when it is done, wakes the oldest
// waiter, which becomes the next leader. No goroutine outlives a call, so
// the Store still needs no Close.
type groupCommitter struct {
	mu    sync.Mutex
	busy  bool         // a leader is committing a group
	queue []*commitReq // ready, waiting for the next group
}

// commitReq is one segment's share of a group: its temp file, fsynced
// and closed, and its encoded index entry.
type commitReq struct {
	id, tmp  string
	val      []byte
	wake     chan struct{} // capacity 1: finished, or asked to lead
	finished bool          // under groupCommitter.mu
	err      error
}

// commit adds req to the next group and returns when that group is
// committed (nil: durable and indexed).
func (g *groupCommitter) commit(s *Store, req *commitReq) error {
	g.mu.Lock()
	g.queue = append(g.queue, req)
	for {
		if req.finished {
			g.mu.Unlock()
			return req.err
		}
		if !g.busy {
			g.busy = true
			batch := g.queue
			g.queue = nil
			g.mu.Unlock()
			s.commitGroup(batch)
			g.mu.Lock()
			for _, r := range batch {
				r.finished = true
			}
			g.busy = false
			for _, r := range batch {
				signal(r.wake)
			}
			if len(g.queue) > 0 {
				signal(g.queue[0].wake) // the next leader
			}
			continue
		}
		g.mu.Unlock()
		<-req.wake
		g.mu.Lock()
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// commitGroup renames every request's temp file into place, fsyncs the
// directory once and commits every index entry in one transaction,
// setting each request's err. A failure of a shared step fails every
// request that reached it, and each failed request's file is removed.
func (s *Store) commitGroup(batch []*commitReq) {
	if s.fsSync != nil {
		// The files' content and digest tags are durable before any of
		// them takes its segment's name, as with an fsync per file: a
		// file under a segment id is always one that was whole.
		if err := s.fsSync(); err != nil {
			for _, r := range batch {
				r.err = fmt.Errorf("syncfs: %w", err)
				os.Remove(r.tmp)
			}
			return
		}
	}
	var live []*commitReq
	for _, r := range batch {
		if err := os.Rename(r.tmp, filepath.Join(s.dir, r.id)); err != nil {
			r.err = fmt.Errorf("rename: %w", err)
			os.Remove(r.tmp)
			continue
		}
		live = append(live, r)
	}
	fail := func(err error) {
		for _, r := range live {
			r.err = err
			os.Remove(filepath.Join(s.dir, r.id))
		}
		live = nil
	}
	if len(live) == 0 {
		return
	}
	if err := s.hit(stepRenamed); err != nil {
		fail(err)
		return
	}
	if err := syncDir(s.dir); err != nil {
		fail(fmt.Errorf("fsync dir: %w", err))
		return
	}
	if err := s.hit(stepDirSync); err != nil {
		fail(err)
		return
	}
	var conflicts []*commitReq
	err := s.db.Update(func(tx *bolt.Tx) error {
		conflicts = conflicts[:0]
		b := tx.Bucket(indexBucket)
		for _, r := range live {
			if b.Get([]byte(r.id)) != nil {
				// Cannot happen while the id is held; refuse rather than
				// overwrite an entry whose file was just replaced.
				conflicts = append(conflicts, r)
				continue
			}
			if err := b.Put([]byte(r.id), r.val); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fail(fmt.Errorf("index: %w", err))
		return
	}
	for _, r := range conflicts {
		r.err = errors.New("index entry for " + r.id + " appeared during write")
		os.Remove(filepath.Join(s.dir, r.id))
	}
	// Committed and durable: past this point the writes succeed, so the
	// hook only marks the point for crash tests and cannot fail them.
	_ = s.hit(stepIndexed)
}
