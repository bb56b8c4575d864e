package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

// TestLostSegmentComesBack: b acknowledged two segments from a (one
// packed, one a file of its own), then its copies are damaged while it is
// down after a kill -9. Its start quarantines both; they are not lost for
// good although a's records say b has them: b asks a for them (WANT,
// wire version 3) and a sends them again, or, with b held at version 2,
// an operator's edgectl relay resend on a does. Each copy that arrives is
// verified by b's commit path, and the bytes on b's disk are a's.
func TestLostSegmentComesBack(t *testing.T) {
	t.Parallel()
	for _, version := range []int{3, 2} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, "a", "b")
			a, b := c.nodes["a"], c.nodes["b"]
			b.relay += fmt.Sprintf("  max_protocol_version: %d\n", version)
			b.start()
			a.start()
			segs := map[string][]byte{
				"small": bytes.Repeat([]byte("small segment "), 300),   // packed
				"large": bytes.Repeat([]byte("large segment "), 10000), // a file of its own
			}
			for id, content := range segs {
				putFile(t, a, id, content)
			}
			for id := range segs {
				eventually(t, "b acked "+id, a.inState(id, "b", "acked"))
			}
			b.kill()
			disk := onDisk(t, b)
			for id := range segs {
				f, ok := disk.Segments[id]
				if !ok {
					t.Fatalf("b has no %s on disk", id)
				}
				damageFile(t, f.Path, f.Off+64, 8)
			}
			if !disk.Segments["small"].Packed || disk.Segments["large"].Packed {
				t.Fatalf("layout: small packed %v, large packed %v", disk.Segments["small"].Packed, disk.Segments["large"].Packed)
			}

			b.start()
			st := ctlJSON[rpc.Storage](t, b, "storage")
			if len(st.Quarantined) != 2 {
				t.Fatalf("b's start quarantined %+v", st.Quarantined)
			}
			if version == 2 {
				// b cannot ask a version 2 peer... nor can a version 2 b ask
				// anyone: the operator resends from a.
				for id := range segs {
					if out := edgectl(t, a.rpc, "relay", "resend", id, "--peer", "b"); !strings.Contains(out, "scheduled again") {
						t.Fatalf("edgectl relay resend %s: %s", id, out)
					}
				}
			}
			for id, content := range segs {
				eventually(t, "b holds "+id+" again", func() bool { return b.has(id, digest(content)) })
			}
			eventually(t, "b no longer wants them", func() bool { return len(ctlJSON[rpc.Storage](t, b, "storage").Wanted) == 0 })
			for id := range segs {
				eventually(t, "a's record for "+id+" acked again", a.inState(id, "b", "acked"))
			}
			if version == 3 && (!strings.Contains(b.log(), `msg="asked a peer for lost segments" node=b peer=a asked=2 granted=2`) ||
				!strings.Contains(a.log(), `msg="peer asked for lost segments"`)) {
				t.Error("the WANT round is not in the logs")
			}
			b.stop()
			disk = onDisk(t, b)
			for id, content := range segs {
				if got := disk.Segments[id].Content; !bytes.Equal(got, content) {
					t.Errorf("b's %s on disk: %d bytes, not a's", id, len(got))
				}
			}
			a.ledgerConsistent(t)
		})
	}
}
