package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

// damageFile overwrites n bytes at off with a pattern that is neither a
// bbolt page nor segment content.
func damageFile(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xA5, 0x5A, 0xFF, 0x01}, int(n/4)), off); err != nil {
		t.Fatal(err)
	}
}

// TestSelfRepairAtStart: a's database and one of its segment files are
// damaged while it is stopped. The real edged starts anyway: it sets the
// database aside, rebuilds the index from the segment files, quarantines
// the damaged one, reports all of it (log, metric, edgectl storage),
// re-derives what it owes b (b re-acknowledges what it holds), and serves.
// Then a kill -9 and a torn segment file: quarantined at the next start,
// with the database kept.
func TestSelfRepairAtStart(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "b", "a") // a on a loopback port, b on a unix socket
	a, b := c.nodes["a"], c.nodes["b"]
	b.start()
	a.start()
	segs := map[string][]byte{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("seg-%d", i)
		segs[id] = bytes.Repeat([]byte(id+" content "), 500*i)
		putFile(t, a, id, segs[id])
	}
	for id := range segs {
		eventually(t, "b acked "+id, a.inState(id, "b", "acked"))
	}
	a.stop()
	seg2 := onDisk(t, a).Segments["seg-2"]
	data := filepath.Join(c.dir, "data-a")
	db := filepath.Join(data, "edged.db")
	fi, err := os.Stat(db)
	if err != nil {
		t.Fatal(err)
	}
	damageFile(t, db, 8192, fi.Size()-8192)
	damageFile(t, seg2.Path, seg2.Off+100, 8)

	a.start()
	st := ctlJSON[rpc.Storage](t, a, "storage")
	if !strings.HasPrefix(st.DBMovedAside, db+".damaged-") || st.DBDamage == "" {
		t.Fatalf("database not reported set aside: %+v", st)
	}
	if !st.PreviousStopClean {
		t.Error("a SIGTERM stop was not recorded as clean")
	}
	if _, err := os.Stat(st.DBMovedAside); err != nil {
		t.Fatalf("set-aside database: %v", err)
	}
	if !slices.Equal(st.Rebuilt, []string{"seg-1", "seg-3"}) || len(st.Unverified) != 0 ||
		len(st.Quarantined) != 1 || st.Quarantined[0].Segment != "seg-2" {
		t.Fatalf("storage report %+v", st)
	}
	if _, err := os.Stat(filepath.Join(st.QuarantineDir, st.Quarantined[0].File)); err != nil {
		t.Fatalf("quarantined file: %v", err)
	}
	if p := st.Packs; !p.Packing || p.Files < 1 || p.Segments != 2 || p.RecordBytes < int64(len(segs["seg-1"])+len(segs["seg-3"])) {
		t.Fatalf("packs %+v: want seg-1 and seg-3 packed", p)
	}
	text := edgectl(t, a.rpc, "storage")
	for _, want := range []string{`database damaged +moved to `, `index rebuilt +2 segments`, `quarantined +seg-2 -> `,
		`packs +on \(segments up to 65536 bytes\); files \d+, segments 2,`} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("edgectl storage lacks %q:\n%s", want, text)
		}
	}
	m, err := a.client.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`edged_storage_repairs_total{action="db_moved_aside"} 1`,
		`edged_storage_repairs_total{action="quarantined"} 1`, `edged_storage_repairs_total{action="rebuilt"} 2`,
		"edged_storage_packed_segments 2"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if log := a.log(); !strings.Contains(log, `msg="database damaged: set aside`) || !strings.Contains(log, `msg="damaged segment file quarantined`) {
		t.Error("repairs not logged")
	}
	// The ledger is re-derived: the rebuilt segments are owed to b again,
	// and b, which holds them, acknowledges them again. The quarantined
	// one is not served.
	for _, id := range []string{"seg-1", "seg-3"} {
		eventually(t, "b re-acked "+id, a.inState(id, "b", "acked"))
	}
	if _, ok := a.record("seg-2", "b"); ok || a.has("seg-2", digest(segs["seg-2"])) {
		t.Error("quarantined segment still indexed or owed")
	}
	for id, content := range segs {
		if !b.has(id, digest(content)) {
			t.Errorf("b lost %s", id)
		}
	}
	// And it serves: a new segment goes through.
	putFile(t, a, "seg-4", []byte("after the repair"))
	eventually(t, "b acked seg-4", a.inState("seg-4", "b", "acked"))

	// kill -9, then a torn segment file: quarantined, database kept. (Packed,
	// seg-3 is the last record of its pack: seg-4 went to a new pack after
	// the restart, so cutting the pack tears seg-3 alone.)
	a.kill()
	seg3 := onDisk(t, a).Segments["seg-3"]
	if err := os.Truncate(seg3.Path, seg3.Off+10); err != nil {
		t.Fatal(err)
	}
	a.start()
	st = ctlJSON[rpc.Storage](t, a, "storage")
	if st.DBMovedAside != "" || len(st.Rebuilt) != 0 || len(st.Quarantined) != 1 || st.Quarantined[0].Segment != "seg-3" {
		t.Fatalf("after a torn file: %+v", st)
	}
	// kill -9 is an unclean stop: the start hashed the two intact files
	// (the torn one was caught by its size).
	if st.PreviousStopClean || st.Verified != 2 {
		t.Errorf("after kill -9: previous_stop_clean %v, verified %d; want false, 2", st.PreviousStopClean, st.Verified)
	}
	if !a.has("seg-4", digest([]byte("after the repair"))) {
		t.Errorf("index after a torn file: %+v", a.index())
	}
	// The torn seg-3 is not lost for good: a asks b, which it had delivered
	// it to, for a good copy (WANT), and b sends it back.
	eventually(t, "a got seg-3 back from b", func() bool { return a.has("seg-3", digest(segs["seg-3"])) })
	eventually(t, "a no longer wants seg-3", func() bool { return len(ctlJSON[rpc.Storage](t, a, "storage").Wanted) == 0 })
	a.ledgerConsistent(t)
}
