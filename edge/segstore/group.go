package segstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
// and closed, or (data set) its verified content bound for a pack; and
// its index entry, whose location the leader fills in for a packed one.
type commitReq struct {
	tmp  string
	data []byte
	// rec, when set, is the pack record data lies in, header left to
	// fill (Staged.rec).
	rec      []byte
	entry    Entry
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

// group is one commit group in progress: the requests still live, and
// what undoing them takes.
type group struct {
	s       *Store
	files   []*commitReq // segment files: temp files, renamed once renamed is set
	renamed bool
	packed  []*commitReq // records appended to w from start on
	w       *packWriter
	start   int64
}

// fail fails every live request with err and removes what they left: a
// request's temp or renamed file, and the group's records (the pack is
// cut back to where the group started).
func (g *group) fail(err error) {
	for _, r := range g.files {
		r.err = err
		if g.renamed {
			os.Remove(filepath.Join(g.s.dir, r.entry.ID))
		} else {
			os.Remove(r.tmp)
		}
	}
	for _, r := range g.packed {
		r.err = err
	}
	if len(g.packed) > 0 {
		g.s.cutPack(g.w, g.start)
	}
	g.files, g.packed = nil, nil
}

// commitGroup commits a group: packed records are appended to the active
// pack; one syncfs (or an fsync of the pack, the files having been
// fsynced on their own) makes every record and file durable; the files
// are renamed into place and segments/ fsynced, a new pack's directory
// entry fsynced; and every index entry is committed in one transaction.
// Each request's err is set. A failure of a shared step fails every
// request that reached it, and removes what it wrote.
func (s *Store) commitGroup(batch []*commitReq) {
	g := &group{s: s}
	var packed []*commitReq
	for _, r := range batch {
		if r.data != nil {
			packed = append(packed, r)
		} else {
			g.files = append(g.files, r)
		}
	}
	if len(packed) > 0 {
		w, err := s.groupPack()
		if err != nil {
			for _, r := range packed {
				r.err = err
			}
		} else {
			g.w, g.start = w, w.end
			g.packed = s.appendPacked(w, packed)
		}
	}
	if len(g.packed) > 0 {
		if err := s.hit(stepPacked); err != nil {
			g.fail(err)
		}
	}
	if len(g.files)+len(g.packed) == 0 {
		return
	}
	// The content is durable before any file takes a segment's name and
	// before any index entry names a record: a file under a segment id,
	// and an indexed record, is always one that was whole.
	if s.fsSync != nil {
		if err := s.fsSync(); err != nil {
			g.fail(fmt.Errorf("syncfs: %w", err))
			return
		}
	} else if len(g.packed) > 0 {
		if err := g.w.f.Sync(); err != nil {
			g.fail(fmt.Errorf("fsync pack %s: %w", g.w.name, err))
			return
		}
	}
	if len(g.files) > 0 && !s.renameFiles(g) {
		return
	}
	if len(g.packed) > 0 {
		if err := s.syncPackDir(g.w); err != nil {
			g.fail(err)
			return
		}
	}
	if err := s.hit(stepDirSync); err != nil {
		g.fail(err)
		return
	}
	live := slices.Concat(g.files, g.packed)
	if len(g.packed) > 0 {
		s.addSpans(g.w, g.packed)
	}
	var conflicts []*commitReq
	err := s.db.Update(func(tx *bolt.Tx) error {
		conflicts = conflicts[:0]
		b := tx.Bucket(indexBucket)
		for _, r := range live {
			if b.Get([]byte(r.entry.ID)) != nil {
				// Cannot happen while the id is held; refuse rather than
				// overwrite an entry whose file was just replaced.
				conflicts = append(conflicts, r)
				continue
			}
			if err := putEntry(b, r.entry); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if len(g.packed) > 0 {
			s.dropSpans(g.w, g.packed, g.start)
		}
		g.fail(fmt.Errorf("index: %w", err))
		return
	}
	for _, r := range conflicts {
		r.err = errors.New("index entry for " + r.entry.ID + " appeared during write")
		if r.data == nil {
			os.Remove(filepath.Join(s.dir, r.entry.ID))
		} else {
			// The record stays in the pack, unindexed: the next start
			// punches it.
			s.dropSpans(g.w, []*commitReq{r}, g.w.end)
		}
	}
	// Committed and durable: past this point the writes succeed, so the
	// hook only marks the point for crash tests and cannot fail them.
	_ = s.hit(stepIndexed)
}

// renameFiles renames the group's temp files into place and fsyncs
// segments/ once; false when the group failed meanwhile.
func (s *Store) renameFiles(g *group) bool {
	var renamed []*commitReq
	for _, r := range g.files {
		if err := os.Rename(r.tmp, filepath.Join(s.dir, r.entry.ID)); err != nil {
			r.err = fmt.Errorf("rename: %w", err)
			os.Remove(r.tmp)
			continue
		}
		renamed = append(renamed, r)
	}
	g.files, g.renamed = renamed, true
	if err := s.hit(stepRenamed); err != nil {
		g.fail(err)
		return false
	}
	if err := syncDir(s.dir); err != nil {
		g.fail(fmt.Errorf("fsync dir: %w", err))
		return false
	}
	return true
}
