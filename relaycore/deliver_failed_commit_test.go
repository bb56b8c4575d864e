package relaycore_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/relaycore"
)

// syncBuffer is a log sink the fires may write from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A target store whose commits fail without landing (a bbolt file on a full
// file system: bbolt cannot say whether a failed commit's meta page was
// written, so infra/bolt reports "outcome unknown") must fail the target's
// round as any refused batch does: a failed attempt with its last error, a
// WARN line, the target blocked, the fire backing off, and quarantine after
// QuarantineAfter rounds. Before, deliver re-read rh, found the batch
// missing and tried again until the calls ran out, then counted "budget
// spent", so the target stayed active with no error and nothing logged.
func TestTargetCommitsThatFailAreFailedAttempts(t *testing.T) {
	e := newEnv(t, "free")
	db, err := bolt.Open(filepath.Join(t.TempDir(), "targets.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	target := db.Store("targets")
	full := true
	tgt := &faultStore{Store: target}
	tgt.set(func(c call) error {
		if c.Op == "apply" && full {
			// What infra/bolt returns when bbolt's write of the new pages
			// fails for want of room.
			return fmt.Errorf("apply %s: commit: %w: %w", c.P, relaycore.ErrMaybeApplied,
				&os.PathError{Op: "write", Path: db.Path(), Err: syscall.ENOSPC})
		}
		return nil
	}, nil)
	var logs syncBuffer
	e.h.Target = tgt
	e.h.QuarantineAfter = 3
	e.h.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.enqueue(put("t1", "k", "v1"), put("t2", "k", "v2"))

	for round := 1; round <= 3; round++ {
		ar, ok := e.alarmOnce()
		if !ok {
			t.Fatalf("round %d: no alarm", round)
		}
		// One call per target and round: a batch rh proves did not land
		// is not retried at once.
		if ar.TargetCalls != 2 || ar.RowsDelivered != 0 {
			t.Fatalf("round %d: %+v, want 2 target calls and nothing delivered", round, ar)
		}
		// The third round quarantines both, moving their rows aside.
		if round < 3 && (ar.TargetsBlock != 2 || ar.Progress || ar.NextDueMS <= e.clock.Now().UnixMilli()) {
			t.Fatalf("round %d: %+v: want both blocked, no progress and a back-off", round, ar)
		}
		if round == 3 && (ar.TargetsQuarantined != 2 || !ar.Cleared) {
			t.Fatalf("round 3: %+v: want both quarantined and nothing left to fire", ar)
		}
		for _, tn := range []relaycore.Partition{"t1", "t2"} {
			s := status(t, e, tn)
			le := s.LastError
			if s.FailedAttempts != round || s.FailedRounds != round || le == nil || le.Class != relaycore.ErrorClassApply ||
				!strings.Contains(le.Message, "not applied") || !strings.Contains(le.Message, "no space left on device") || le.Seq == 0 {
				t.Fatalf("round %d: %s is %+v (last error %+v)", round, tn, s, le)
			}
			if round == 3 && (s.State != relaycore.StateQuarantined || s.Held != 1) {
				t.Fatalf("after %d failed rounds %s is %s with %d held, want quarantined with its row held", round, tn, s.State, s.Held)
			}
		}
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"relay target failed: apply"); n != 6 {
		t.Fatalf("%d WARN lines for 6 failed attempts:\n%s", n, logs.String())
	}
	// And one when each target stops: its quarantine, with why.
	for _, tn := range []string{"t1", "t2"} {
		if n := strings.Count(logs.String(), "msg=\"relay target quarantined: release it once the cause is fixed (docs/operations.md)\" source=src-a target="+tn+" why=\"3 failed rounds in a row\" last_error="); n != 1 {
			t.Fatalf("%d WARN lines for %s's quarantine, want 1:\n%s", n, tn, logs.String())
		}
	}

	// Room again: a release delivers each row once.
	full = false
	for _, tn := range []relaycore.Partition{"t1", "t2"} {
		if _, err := e.h.Release(e.ctx, e.source, tn, relaycore.Actor{By: "op", Reason: "disk freed"}); err != nil {
			t.Fatal(err)
		}
	}
	_, total := e.drain(e.source, 10)
	if total.RowsDelivered != 2 {
		t.Fatalf("after the release %d rows delivered, want 2", total.RowsDelivered)
	}
	for tn, want := range map[relaycore.Partition]string{"t1": "v1", "t2": "v2"} {
		v, ok, err := target.Get(e.ctx, tn, "k")
		if err != nil || !ok || string(v) != want {
			t.Fatalf("%s/k = %q %v %v, want %q", tn, v, ok, err, want)
		}
		if s := status(t, e, tn); s.State != relaycore.StateActive || s.Pending != 0 || s.FailedAttempts != 0 {
			t.Fatalf("%s after the release: %+v", tn, s)
		}
	}
}
