package pgtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// BackendCPU returns the CPU time used so far by the live sessions on
// database db: the server processes serving the pools
// open on it, not the server's own (the checkpointer, autovacuum), whose
// work lands wherever it happens to run. A benchmark whose pools live for
// one run reads it just before closing them: what the server spent on
// that run's statements, a figure that does not move with the machine's
// load the way wall time does.
func (c *Cluster) BackendCPU(db string) (time.Duration, error) {
	pid := strconv.Itoa(c.cmd.Process.Pid)
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	// A session's process title: "postgres: <user> <database> [local] ...".
	title := []byte("postgres: " + superuser + " " + db + " ")
	var total time.Duration
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !bytes.HasPrefix(cmdline, title) {
			continue // gone meanwhile, or not a session on db
		}
		if ppid, err := parentOf(d.Name()); err != nil || ppid != pid {
			continue // gone meanwhile, or another cluster's
		}
		ns, err := schedstat(d.Name())
		if err != nil {
			if os.IsNotExist(err) {
				continue // gone meanwhile
			}
			return 0, err
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// schedstat reads a process's time on a CPU in nanoseconds (the first field
// of /proc/<pid>/schedstat). Not /proc/<pid>/stat's utime and stime: they
// count in 10 ms ticks, rounded down per process, so a round of a
// benchmark, a few ticks per session, loses up to one per session (12.5
// against 27 µs per row in BenchmarkServeThroughputPostgres).
func schedstat(pid string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "schedstat"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("pgtest: /proc/%s/schedstat: empty", pid)
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// parentOf reads a process's parent from /proc/<pid>/stat: after the
// command name (in parentheses, which may hold spaces) come its state and
// its parent's pid.
func parentOf(pid string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return "", err
	}
	s := string(b)
	if end := strings.LastIndexByte(s, ')'); end >= 0 {
		if f := strings.Fields(s[end+1:]); len(f) >= 2 {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("pgtest: /proc/%s/stat: %q", pid, s)
}
