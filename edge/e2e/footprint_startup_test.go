package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// footprintStartup measures two start-ups of the sender a that owe every
// stored segment to a peer anew, after TestFootprint stored and relayed n
// segments from a to b: a peer added to known_peers (n new records, and
// under all_peers n relayed markers cleared), and a database rebuilt (the
// index from the pack records and segment files, then n records). The
// added peer c is never started, so what is measured is the start-up
// itself, not a relay to c. Memory is a's peak right after it is healthy;
// the test fails when it is over budget. Start-up time is reported, not
// judged: on a shared machine a wall-clock figure is not a test.
func footprintStartup(t *testing.T, c *cluster, a *node, n int) {
	t.Helper()
	peers := slices.Clone(a.peers)
	c.nodes["c"] = &node{c: c, id: "c", listen: freePort(t), rpc: freePort(t)}
	var out []string
	measure := func(what string, prepare func()) {
		t.Helper()
		a.stop()
		prepare()
		t0 := time.Now()
		a.start()
		d := time.Since(t0)
		m := rss(t, a)
		line := fmt.Sprintf("%s: start-up %v, a %s", what, d.Round(time.Millisecond), m)
		t.Logf("start-up with %d segments stored, %s", n, line)
		if l := lastLine(a.log(), "ledger reconciled"); !strings.Contains(l, fmt.Sprintf(" scheduled=%d ", n)) {
			t.Errorf("%s: the start-up did not schedule %d records: %s", what, n, l)
		}
		if m.peak > budgetRSSBytes {
			t.Errorf("%s: peak resident memory %s above the %d MiB budget", what, m, budgetRSSBytes>>20)
		}
		out = append(out, line)
	}
	measure("peer added", func() { a.peers = append(slices.Clone(peers), "c") })
	measure("database rebuilt", func() {
		a.peers = peers
		db := filepath.Join(c.dir, "data-"+a.id, "edged.db")
		// Both meta pages zeroed: edged sets the file aside and rebuilds.
		f, err := os.OpenFile(db, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(make([]byte, 2*os.Getpagesize()), 0); err != nil {
			t.Fatal(err)
		}
	})
	fmt.Printf("footprint: start-up owing %d stored segments anew: %s\n", n, strings.Join(out, "; "))

}

// lastLine returns the last line of log that contains s.
func lastLine(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}
