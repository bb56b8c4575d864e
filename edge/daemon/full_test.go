package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
)

// chain starts a → b → c: a sends to b, b forwards to c (a and c are
// accepted by b, not owed anything by it). b holds at most two segments,
// under the given on_full policy, and writes through wrap.
func chain(t *testing.T, onFull string, wrap func(id string, w io.Writer) io.Writer) (a, b, c *testNode) {
	t.Helper()
	dir := pkitest.New(t, "a", "b", "c")
	relayLns := map[string]string{}
	la, lb, lc := listen(t), listen(t), listen(t)
	relayLns["a"], relayLns["b"], relayLns["c"] = la.Addr().String(), lb.Addr().String(), lc.Addr().String()
	ra, rb, rc := listen(t), listen(t), listen(t)
	cc := nodeConfig(t, dir, "c", relayLns["c"], rc.Addr().String(), nil)
	cc.AcceptFrom = []string{"b"}
	bc := nodeConfig(t, dir, "b", relayLns["b"], rb.Addr().String(), []config.Peer{{ID: "c", Address: relayLns["c"]}})
	bc.AcceptFrom = []string{"a"}
	bc.Storage.QuotaSegments = 2
	bc.Storage.OnFull = onFull
	bc.Relay.MaxRetries = 1000 // what b owes c stays owed (not deadlettered) while c is down
	ac := nodeConfig(t, dir, "a", relayLns["a"], ra.Addr().String(), []config.Peer{{ID: "b", Address: relayLns["b"]}})
	ac.Relay.MaxRetries = 1000
	c = startNode(t, cc, lc, rc)
	b = startNode(t, bc, lb, rb, func(o *Options) { o.WrapTemp = wrap })
	a = startNode(t, ac, la, ra)
	return a, b, c
}

func rec(n *testNode, seg, peer string) rpc.Record {
	rs, err := n.client.Records(context.Background(), "all")
	if err != nil {
		return rpc.Record{}
	}
	for _, r := range rs.Records {
		if r.Segment == seg && r.Peer == peer {
			return r
		}
	}
	return rpc.Record{}
}

func acked(n *testNode, seg, peer string) func() bool {
	return func() bool { return rec(n, seg, peer).State == "acked" }
}

// refusedForQuota: a's latest attempt to give seg to b failed with NACK quota.
func refusedForQuota(a *testNode, seg string) func() bool {
	return func() bool {
		r := rec(a, seg, "b")
		return r.State == "failed" && strings.Contains(r.LastError, "quota")
	}
}

func index(t *testing.T, n *testNode) []string {
	t.Helper()
	ix, err := n.client.Index(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range ix.Segments {
		out = append(out, s.ID)
	}
	return out
}

func seg(i int) (string, []byte) {
	id := fmt.Sprintf("s%d", i)
	return id, bytes.Repeat([]byte(id+" "), 300)
}

// fillB sends s1 and s2 through b to c and waits until b relayed both:
// b is then full of segments owed to no one.
func fillB(t *testing.T, a, b *testNode) {
	t.Helper()
	for i := 1; i <= 2; i++ {
		id, content := seg(i)
		put(t, a, id, content)
		waitUntil(t, "b relayed "+id, func() bool { return assured(b, id) })
	}
}

// TestOnFullReject: a full b refuses the next segment with NACK quota and
// evicts nothing; once there is room the sender's retry delivers it.
func TestOnFullReject(t *testing.T) {
	a, b, _ := chain(t, config.OnFullReject, nil)
	fillB(t, a, b)
	id, content := seg(3)
	put(t, a, id, content)
	waitUntil(t, "a refused for quota", refusedForQuota(a, id))
	if got := index(t, b); !slices.Equal(got, []string{"s1", "s2"}) {
		t.Fatalf("b holds %v", got)
	}
	m, _ := b.client.Metrics(context.Background())
	if !strings.Contains(m, `edged_nacks_sent_total{code="quota"}`) || strings.Contains(m, "edged_storage_full_evictions_total 1") {
		t.Error("metrics: want quota NACKs and no evictions")
	}
}

// TestOnFullEvictRelayedOldest: a full b evicts its oldest relayed segment
// to take the next one; once everything it holds is still owed (c is
// down) it evicts nothing and refuses with NACK quota, and what is owed
// stays until c has it.
func TestOnFullEvictRelayedOldest(t *testing.T) {
	a, b, c := chain(t, config.OnFullEvictRelayedOldest, nil)
	fillB(t, a, b)
	id3, c3 := seg(3)
	put(t, a, id3, c3)
	waitUntil(t, "b took s3", acked(a, id3, "b"))
	if got := index(t, b); !slices.Equal(got, []string{"s2", "s3"}) {
		t.Fatalf("b holds %v, want s1 (oldest relayed) evicted", got)
	}
	waitUntil(t, "b relayed s3", func() bool { return assured(b, id3) })

	c.stop()
	for i := 4; i <= 5; i++ {
		id, content := seg(i)
		put(t, a, id, content)
		waitUntil(t, "b took "+id, acked(a, id, "b"))
	}
	if got := index(t, b); !slices.Equal(got, []string{"s4", "s5"}) {
		t.Fatalf("b holds %v, want s4 and s5 (owed to c)", got)
	}
	id6, c6 := seg(6)
	put(t, a, id6, c6)
	waitUntil(t, "a refused for quota", refusedForQuota(a, id6))
	if got := index(t, b); !slices.Equal(got, []string{"s4", "s5"}) {
		t.Fatalf("b evicted a segment still owed: holds %v", got)
	}
	m, _ := b.client.Metrics(context.Background())
	if !strings.Contains(m, "edged_storage_full_evictions_total 3") {
		t.Error("metrics: want 3 evictions")
	}
}

// diskFullFor makes the real store's writes of one segment fail part-way
// with ENOSPC while on is set.
func diskFullFor(seg string, on *atomic.Bool) func(id string, w io.Writer) io.Writer {
	return func(id string, w io.Writer) io.Writer {
		if id != seg || !on.Load() {
			return w
		}
		return &failAfter{w: w, n: 1000}
	}
}

type failAfter struct {
	w io.Writer
	n int
}

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k, _ := f.w.Write(p[:f.n])
		f.n = 0
		return k, &os.PathError{Op: "write", Path: "segment", Err: syscall.ENOSPC}
	}
	f.n -= len(p)
	return f.w.Write(p)
}

// TestDiskFullMidSegment: the disk refuses b's write part-way through a
// segment although the quota has room. b NACKs quota, keeps nothing of it
// (no temp file, no entry, quota whole), goes on serving, and the
// sender's retry delivers it once the disk has room. Under
// evict_relayed_oldest the full disk also evicts b's oldest relayed
// segment, so the retry finds room.
func TestDiskFullMidSegment(t *testing.T) {
	for _, policy := range []string{config.OnFullReject, config.OnFullEvictRelayedOldest} {
		t.Run(policy, func(t *testing.T) {
			var full atomic.Bool
			full.Store(true)
			a, b, _ := chain(t, policy, diskFullFor("big", &full))
			id, content := seg(1)
			put(t, a, id, content)
			waitUntil(t, "b relayed s1", func() bool { return assured(b, id) })
			big := bytes.Repeat([]byte("big "), 20_000)
			put(t, a, "big", big)
			waitUntil(t, "a refused for quota", refusedForQuota(a, "big"))
			if r := rec(a, "big", "b"); !strings.Contains(r.LastError, "disk full") {
				t.Errorf("last error %q does not say disk full", r.LastError)
			}
			want := []string{"s1"}
			if policy == config.OnFullEvictRelayedOldest {
				want = nil
			}
			if got := index(t, b); !slices.Equal(got, want) {
				t.Fatalf("b holds %v; want %v", got, want)
			}
			// a keeps retrying while the disk is full, and an attempt in
			// flight holds a reservation and a temp file on b. Between
			// attempts nothing of them may remain: a leak never clears and
			// fails the wait.
			var left string
			func() {
				defer func() {
					if t.Failed() {
						t.Logf("last seen on b: %s", left)
					}
				}()
				waitUntil(t, "no temp file or reservation left on b between a's attempts", func() bool {
					left = leftovers(t, b, int64(len(want)))
					return left == ""
				})
			}()
			full.Store(false)
			waitUntil(t, "b took big", acked(a, "big", "b"))
		})
	}
}

// leftovers describes what b holds beyond its stored segments (temp files,
// reservations, a stored count other than segments); "" when nothing.
func leftovers(t *testing.T, b *testNode, segments int64) string {
	t.Helper()
	files, err := os.ReadDir(filepath.Join(b.cfg.Storage.Dir, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasPrefix(f.Name(), ".") {
			return "temp file " + f.Name()
		}
	}
	q, err := b.client.Quota(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if q.ReservedBytes != 0 || q.ReservedSegments != 0 || q.Segments != segments {
		return fmt.Sprintf("quota %+v", q)
	}
	return ""
}

// TestBandwidthLimitApplies: with relay.bandwidth set, or a peer's own
// known_peers[].bandwidth, a's connection to b goes through the limiter
// (its waits are counted per peer) and delivery still completes. The
// limiter's arithmetic is edge/bandwidth's test, on a fake clock.
func TestBandwidthLimitApplies(t *testing.T) {
	for name, limit := range map[string]func(*config.Config){
		"relay.bandwidth": func(cfg *config.Config) {
			cfg.Relay.Bandwidth = config.Bandwidth{PerPeer: 1 << 20, Total: 4 << 20}
		},
		"known_peers[].bandwidth": func(cfg *config.Config) {
			for i := range cfg.KnownPeers {
				cfg.KnownPeers[i].Bandwidth = 1 << 20
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := pkitest.New(t, "a", "b")
			nodes := startCluster(t, dir, []string{"a", "b"}, limit)
			a, b := nodes["a"], nodes["b"]
			put(t, a, "big", bytes.Repeat([]byte("limited "), 40_000)) // 320 kB: beyond one burst
			waitUntil(t, "b stores big", func() bool { return stored(b, "big") })
			m, err := a.client.Metrics(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(m, `edged_relay_throttled_seconds_total{peer="b"}`) {
				t.Fatalf("no throttling recorded for b:\n%s", m)
			}
		})
	}
}
