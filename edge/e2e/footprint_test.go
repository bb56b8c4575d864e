package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The device footprint budget (docs/benchmarks.md, "Device footprint"): run
// by `make bench`, not by `make test` (it stores 10,000 segments twice).
var (
	footprint         = flag.Bool("footprint", false, "measure edged's device footprint (make bench)")
	footprintSegments = flag.Int("footprint-segments", 10000, "segments stored and relayed by the footprint run")
	footprintBytes    = flag.Int("footprint-bytes", 4096, "bytes per segment in the footprint run")
)

// Budget: what a small board can give the agent.
const (
	budgetRSSBytes = 32 << 20
	budgetStartup  = time.Second
)

// TestFootprint measures, on the real edged binary: resident memory idle
// and after storing and relaying N segments (sender and receiver), start-up
// time with N segments stored (reconciliation included), the start-ups
// that owe every stored segment to a peer anew (footprintStartup: a peer
// added, a database rebuilt), and the size of the release binaries. It
// fails when the budget is exceeded.
func TestFootprint(t *testing.T) {
	if !*footprint {
		t.Skip("run with -footprint (make bench)")
	}
	n, size := *footprintSegments, *footprintBytes
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	quota := fmt.Sprintf("  quota_segments: %d\n  quota_bytes: %d\n  max_segment_bytes: %d\n", n+10, int64(n+10)*int64(size)+1<<20, size)
	a.storage, b.storage = quota, quota
	a.relay = "  backoff: {initial: 50ms, max: 200ms}\n  ack_timeout: 10s\n  dial_timeout: 2s\n"
	b.start()
	a.start()
	idleA, idleB := rss(t, a), rss(t, b)
	t.Logf("idle: a %s, b %s", idleA, idleB)

	start := time.Now()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, size)
			for i := w; i < n; i += 4 {
				copy(body, fmt.Sprintf("segment %08d ", i))
				sum := sha256.Sum256(body)
				if _, err := a.client.PutSegment(ctx, fmt.Sprintf("seg-%06d", i), int64(size), hex.EncodeToString(sum[:]), bytes.NewReader(body)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	ingested := time.Since(start)
	deadline := time.Now().Add(30 * time.Minute)
	for {
		st, err := a.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Relayed >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relayed %d of %d within 30 minutes", st.Relayed, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	relayed := time.Since(start)
	afterA, afterB := rss(t, a), rss(t, b)
	t.Logf("%d segments of %d bytes: ingested in %v, relayed in %v", n, size, ingested.Round(time.Millisecond), relayed.Round(time.Millisecond))
	t.Logf("after: a (sender) %s, b (receiver) %s", afterA, afterB)

	// Start-up with n segments stored: from exec to healthy, which is
	// after reconciliation (edged serves RPC only once it ran).
	var startups []time.Duration
	for _, node := range []*node{b, a} {
		node.stop()
		t0 := time.Now()
		node.start()
		startups = append(startups, time.Since(t0))
	}
	restartB := rss(t, b)
	t.Logf("start-up with %d segments stored: b %v, a %v; b's memory after it: %s", n, startups[0].Round(time.Millisecond), startups[1].Round(time.Millisecond), restartB)

	footprintStartup(t, c, a, n) // a peer added, a database rebuilt

	sizes := releaseSizes(t)
	t.Logf("release binaries (static, trimmed, stripped): %s", sizes)

	fmt.Printf("footprint: segments %d x %d B; rss idle a %s b %s; rss after store+relay a %s b %s; startup b %v a %v; binaries %s\n",
		n, size, idleA, idleB, afterA, afterB, startups[0].Round(time.Millisecond), startups[1].Round(time.Millisecond), sizes)
	for _, m := range []mem{afterA, afterB, restartB} {
		if m.peak > budgetRSSBytes {
			t.Errorf("peak resident memory %s above the %d MiB budget", m, budgetRSSBytes>>20)
		}
	}
	for _, d := range startups {
		if d > budgetStartup {
			t.Errorf("start-up %v above the %v budget", d, budgetStartup)
		}
	}
	t.Run("backlog", footprintBacklog)
}

// Backlog case: a sender that stored backlogSegments of backlogBytes
// while its peer was down drains them into it, with the default
// configuration (pack files, a window of 256, PUSH up to 64 KiB): the
// receiver reads a window of 64 KiB segments at a time from each of the
// sender's workers.
const (
	backlogSegments = 3000
	backlogBytes    = 64 << 10
)

// footprintBacklog holds the receiver's peak while it drains the backlog
// to the budget (issue 20: it was 53-58 MiB).
func footprintBacklog(t *testing.T) {
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	a.relay = "  backoff: {initial: 50ms, max: 200ms}\n"
	a.start()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, backlogBytes)
			for i := w; i < backlogSegments; i += 4 {
				copy(body, fmt.Sprintf("segment %08d ", i))
				sum := sha256.Sum256(body)
				if _, err := a.client.PutSegment(ctx, fmt.Sprintf("seg-%06d", i), backlogBytes, hex.EncodeToString(sum[:]), bytes.NewReader(body)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b.start()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		st, err := a.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Relayed >= backlogSegments {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relayed %d of %d within 10 minutes", st.Relayed, backlogSegments)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m := rss(t, b)
	t.Logf("backlog of %d x %d B drained in %v; receiver b %s", backlogSegments, backlogBytes, time.Since(start).Round(time.Millisecond), m)
	fmt.Printf("footprint: backlog %d x %d B drained in %v; rss b %s\n", backlogSegments, backlogBytes, time.Since(start).Round(time.Millisecond), m)
	if m.peak > budgetRSSBytes {
		t.Errorf("receiver's peak resident memory %s above the %d MiB budget", m, budgetRSSBytes>>20)
	}
}

// mem is a process's resident memory now and at its peak, and what is
// resident now split into anonymous memory (Go heap, stacks, runtime) and
// file pages (the binary's text and data, bbolt's memory-mapped database),
// which the kernel can drop and read back under memory pressure.
type mem struct{ now, peak, anon, file int64 }

func (m mem) String() string {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	return fmt.Sprintf("%.1f MiB (peak %.1f MiB; now %.1f anonymous + %.1f file)", mib(m.now), mib(m.peak), mib(m.anon), mib(m.file))
}

// rss reads VmRSS and VmHWM of n's process.
func rss(t *testing.T, n *node) mem {
	t.Helper()
	n.mu.Lock()
	pid := n.cmd.Process.Pid
	n.mu.Unlock()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m mem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.now = kb << 10
		case "VmHWM":
			m.peak = kb << 10
		case "RssAnon":
			m.anon = kb << 10
		case "RssFile":
			m.file = kb << 10
		}
	}
	return m
}

// releaseSizes builds edged and edgectl as `make dist` does and returns
// their sizes per platform.
func releaseSizes(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, p := range []struct{ name, arch, arm string }{{"linux/amd64", "amd64", ""}, {"linux/arm64", "arm64", ""}, {"linux/arm v7", "arm", "7"}} {
		var parts []string
		for _, cmd := range []string{"edged", "edgectl"} {
			path := filepath.Join(dir, p.arch+"-"+cmd)
			build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", path, "../../cmd/"+cmd)
			build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+p.arch, "GOARM="+p.arm)
			if b, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build %s for %s: %v\n%s", cmd, p.name, err, b)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, fmt.Sprintf("%s %.1f MiB", cmd, float64(fi.Size())/(1<<20)))
		}
		out = append(out, p.name+": "+strings.Join(parts, ", "))
	}
	return strings.Join(out, "; ")
}
