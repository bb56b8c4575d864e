package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// groupOf runs n concurrent writes of segments g0..g(n-1) while a first
// write ("lead") is held at stepRenamed, so all n queue behind it and are
// committed as one group. hook runs at every step of that second group
// (after the lead's group). It returns each write's error and how many
// index commits (stepIndexed) happened in total.
func groupOf(t *testing.T, f *fixture, n int, hook func(step) error) (errs []error, indexCommits int) {
	t.Helper()
	release := make(chan struct{})
	var mu sync.Mutex
	group := 0
	f.s.fault = func(st step) error {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case stepRenamed:
			group++
			if group == 1 {
				mu.Unlock()
				<-release
				mu.Lock()
			}
		case stepIndexed:
			indexCommits++
		}
		if group == 2 && hook != nil {
			return hook(st)
		}
		return nil
	}
	lead := make(chan error, 1)
	go func() {
		b := content(100, 9)
		_, err := f.s.Write("lead", int64(len(b)), digest(b), bytes.NewReader(b), "")
		lead <- err
	}()
	// Wait until the lead holds the group (its rename hook is blocked).
	for {
		f.s.group.mu.Lock()
		busy := f.s.group.busy
		f.s.group.mu.Unlock()
		mu.Lock()
		started := group == 1
		mu.Unlock()
		if busy && started {
			break
		}
		runtime.Gosched()
	}
	errs = make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := content(1000+i, byte(i))
			_, errs[i] = f.s.Write(fmt.Sprintf("g%d", i), int64(len(b)), digest(b), bytes.NewReader(b), "")
		}()
	}
	for {
		f.s.group.mu.Lock()
		queued := len(f.s.group.queue)
		f.s.group.mu.Unlock()
		if queued == n {
			break
		}
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if err := <-lead; err != nil {
		t.Fatalf("lead write: %v", err)
	}
	return errs, indexCommits
}

// TestGroupCommit: segments that become ready while a group is being
// committed are committed together: one index transaction (and one
// directory fsync) for all of them.
func TestGroupCommit(t *testing.T) {
	f := newStore(t, "", testOpts)
	const n = 8
	errs, commits := groupOf(t, f, n, nil)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("g%d: %v", i, err)
		}
		b := content(1000+i, byte(i))
		if !bytes.Equal(read(t, f.s, fmt.Sprintf("g%d", i)), b) {
			t.Fatalf("g%d content differs", i)
		}
	}
	if commits != 2 {
		t.Fatalf("%d index commits for 1+%d segments, want 2 (the lead, then one group)", commits, n)
	}
	checkInvariant(t, f)
}

// TestGroupCommitCrashBeforeIndex: a crash between the group's directory
// fsync and its index commit (snapshot of disk and database at that
// instant) leaves none of the group stored after recovery, and a failure
// there fails every write of the group: no writer was told "stored" (so
// no ACK went out) for a segment the recovered store lacks.
func TestGroupCommitCrashBeforeIndex(t *testing.T) {
	const n = 5
	for _, crash := range []bool{true, false} {
		t.Run(fmt.Sprintf("snapshot=%v", crash), func(t *testing.T) {
			f := newStore(t, "", testOpts)
			snap := t.TempDir()
			injected := errors.New("injected fault after the group's directory fsync")
			errs, _ := groupOf(t, f, n, func(st step) error {
				if st != stepDirSync {
					return nil
				}
				if crash {
					snapshot(t, f, snap)
					return nil
				}
				return injected
			})
			if !crash {
				for i, err := range errs {
					if !errors.Is(err, injected) {
						t.Fatalf("g%d: err = %v, want the injected fault", i, err)
					}
					if _, err := f.s.Stat(fmt.Sprintf("g%d", i)); !errors.Is(err, ErrNotFound) {
						t.Fatalf("g%d indexed after a failed group: %v", i, err)
					}
				}
				checkInvariant(t, f)
				if u := f.s.Usage(); u.Segments != 1 || u.ReservedBytes != 0 {
					t.Fatalf("usage %+v", u)
				}
				return
			}
			g := newStore(t, snap, testOpts)
			for i := range n {
				if _, err := g.s.Stat(fmt.Sprintf("g%d", i)); !errors.Is(err, ErrNotFound) {
					t.Fatalf("g%d present after a crash before its index commit: %v", i, err)
				}
			}
			if rep := g.s.Recovered(); len(rep.RemovedOrphans) != n {
				t.Fatalf("recovery removed %v, want the group's %d files", rep.RemovedOrphans, n)
			}
			checkInvariant(t, g)
		})
	}
}
