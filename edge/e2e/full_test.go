package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

func (n *node) ids() []string {
	var out []string
	for _, s := range n.index() {
		out = append(out, s.ID)
	}
	return out
}

func (n *node) relayed(id string) func() bool {
	return func() bool {
		return slices.ContainsFunc(n.index(), func(s rpc.Segment) bool { return s.ID == id && s.Relayed })
	}
}

// putFileCode is putFile that returns edgectl's output and exit code.
func putFileCode(t *testing.T, n *node, id string, content []byte) (string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), id)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return edgectlCode(t, n.rpc, "segment", "put", path)
}

func fullSeg(i int) (string, []byte) {
	id := fmt.Sprintf("s%d", i)
	return id, bytes.Repeat([]byte(id+" "), 400)
}

// TestStorageFullPolicies runs both storage.on_full policies on a real
// edged (a, at most two segments) relaying to b. Full of relayed
// segments, reject refuses the next one (HTTP 507, quota) and keeps what
// it has; evict_relayed_oldest evicts the oldest relayed one and takes
// it, and once everything a holds is still owed to b (b down) it evicts
// nothing and refuses; b gets every segment a accepted.
func TestStorageFullPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reject", "evict_relayed_oldest"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, "b", "a")
			a, b := c.nodes["a"], c.nodes["b"]
			a.storage = "  quota_segments: 2\n  on_full: " + policy + "\n"
			// b is down for a while below: s4 and s5 must not be
			// deadlettered meanwhile.
			a.relay = "  backoff: {initial: 50ms, max: 200ms}\n  max_retries: 1000\n  dial_timeout: 2s\n"
			b.start()
			a.start()
			for i := 1; i <= 2; i++ {
				id, content := fullSeg(i)
				putFile(t, a, id, content)
				eventually(t, "a relayed "+id, a.relayed(id))
			}
			id3, c3 := fullSeg(3)
			out, code := putFileCode(t, a, id3, c3)
			if policy == "reject" {
				if code == 0 || !strings.Contains(out, "quota") {
					t.Fatalf("put into a full store: exit %d\n%s", code, out)
				}
				if got := a.ids(); !slices.Equal(got, []string{"s1", "s2"}) {
					t.Fatalf("a holds %v", got)
				}
				if strings.Contains(a.log(), "storage full: evicted") {
					t.Error("reject evicted something")
				}
				return
			}
			if code != 0 {
				t.Fatalf("put with evict_relayed_oldest: exit %d\n%s", code, out)
			}
			if got := a.ids(); !slices.Equal(got, []string{"s2", "s3"}) {
				t.Fatalf("a holds %v, want s1 (oldest relayed) evicted", got)
			}
			if !strings.Contains(a.log(), `msg="storage full: evicted relayed segments" node=a segments=[s1]`) {
				t.Error("eviction not logged")
			}
			eventually(t, "a relayed s3", a.relayed(id3))
			b.stop()
			for i := 4; i <= 5; i++ {
				id, content := fullSeg(i)
				putFile(t, a, id, content) // evicts s2, then s3
			}
			id6, c6 := fullSeg(6)
			if out, code := putFileCode(t, a, id6, c6); code == 0 || !strings.Contains(out, "quota") {
				t.Fatalf("put with only owed segments stored: exit %d\n%s", code, out)
			}
			if got := a.ids(); !slices.Equal(got, []string{"s4", "s5"}) {
				t.Fatalf("a holds %v, want the owed s4 and s5", got)
			}
			b.start()
			for i := 1; i <= 5; i++ {
				id, content := fullSeg(i)
				eventually(t, "b has "+id, func() bool { return b.has(id, digest(content)) })
			}
			// b stores a segment before it sends the ACK that a records:
			// a is at rest only once it has recorded s4's and s5's.
			for i := 4; i <= 5; i++ {
				id, _ := fullSeg(i)
				eventually(t, "a recorded b's ACK of "+id, a.inState(id, "b", "acked"))
			}
			a.ledgerConsistent(t)
		})
	}
}
