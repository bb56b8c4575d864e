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

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on every Linux
// build Go runs on).
const clockTick = 10 * time.Millisecond

// BackendCPU returns the CPU time used so far by the
// live sessions on database db: the server processes serving the pools
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
		st, err := procStat(d.Name())
		if err != nil || st.ppid != pid {
			continue
		}
		if ns, ok := schedstat(d.Name()); ok {
			total += time.Duration(ns)
		} else {
			total += time.Duration(st.utime+st.stime) * clockTick
		}
	}
	return total, nil
}

// schedstat reads a process's time on a CPU in nanoseconds (the first field
// of /proc/<pid>/schedstat), finer than /proc/<pid>/stat's 10 ms ticks,
// which one round of a benchmark spends only a few of per session.
func schedstat(pid string) (int64, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "schedstat"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return ns, err == nil
}

type stat struct {
	ppid         string
	utime, stime int64
}

// procStat reads /proc/<pid>/stat: after the command name (in parentheses,
// which may hold spaces) come state, ppid (field 4), ..., utime (field 14)
// and stime.
func procStat(pid string) (stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return stat{}, err
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return stat{}, fmt.Errorf("pgtest: /proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return stat{}, fmt.Errorf("pgtest: /proc/%s/stat: %d fields", pid, len(f)+2)
	}
	n := func(field int) int64 { v, _ := strconv.ParseInt(f[field-3], 10, 64); return v }
	return stat{ppid: f[4-3], utime: n(14), stime: n(15)}, nil
}
