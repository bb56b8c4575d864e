package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/linkem"
	"github.com/relay-dev/relay/edge/segstore"
)

// TestDiskFullReceiver: a relays to b through a linkem link, and b
// forwards to c; b runs the faultinject build of edged, whose segment
// store fails writes with ENOSPC at a chosen point while a control file
// names it (edge/segstore/faultinject.go), and succeeds again once the
// file no longer does. Mid-stream, b's disk "fills" at each point of the
// write path in turn (temp file created, content half written, content
// written, fsynced, the commit group's syncfs, renamed, directory
// fsynced; and for the 4 KiB segments, which b packs, the record appended
// to its pack), first with c up and, from the fourth point on, with c down;
// then b is killed with kill -9 while its disk is full, restarted still
// full, and finally the disk clears. The same run under storage.on_full:
// reject and evict_relayed_oldest. What must hold:
//
//   - The NACK is quota: b's refusals of the injected writes are logged
//     as code=quota, counted in edged_nacks_sent_total{code="quota"}, and
//     a's ledger shows the quota refusal naming the fault point.
//   - Nothing Acked that b does not durably hold: at every check (during
//     the fault, and after the kill -9 and restart), every record a holds
//     as acked for b names a segment b holds with a's digest, or, under
//     evict_relayed_oldest only, one b evicted after c had acknowledged it
//     (and c holds it with that digest).
//   - Nothing left behind: with no transfer in progress (a stopped, b's
//     reservations back to zero), b's segment directory holds no temp file
//     and exactly one file per index entry, each file's SHA-256 that of
//     the content ingested on a.
//   - Only segments whose success condition is met are evicted: never
//     under reject; under evict_relayed_oldest, while c is down no segment
//     still owed to c leaves b's index, and every segment b logs as evicted
//     is one c acknowledged (b's record for c is acked) and holds.
//   - Nothing lost: once the disk clears, every segment ingested on a is
//     acked by b, and held by b byte-identical (or, evicted as above, by c);
//     c holds every one of them.
//
// No step waits for time to pass: each polls for a state with the
// harness's generous deadline.
func TestDiskFullReceiver(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reject", "evict_relayed_oldest"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			runDiskFull(t, policy)
		})
	}
}

// TestDiskFullIngest: the sender's own disk fills while `edgectl segment
// put` writes into it (a runs the faultinject edged), at each write point
// in turn, with a holding one segment b has (relayed) and one still owed
// to b (b is down). What must hold, under both storage.on_full policies:
// the put fails with HTTP 507 naming the quota and the fault point; a
// keeps nothing of it (no temp file, no entry, every file its segment's
// content); the owed segment is never evicted; the relayed one is evicted
// under evict_relayed_oldest (the full disk asks for room) and kept under
// reject; once the disk clears the same puts succeed and b receives every
// segment.
func TestDiskFullIngest(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reject", "evict_relayed_oldest"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			cl := newCluster(t, "a", "b")
			a, b := cl.nodes["a"], cl.nodes["b"]
			a.relay = "  backoff: {initial: 50ms, max: 200ms}\n  max_retries: 1000\n  dial_timeout: 2s\n"
			a.storage = "  on_full: " + policy + "\n"
			a.faults = filepath.Join(cl.dir, "a-faults")
			setFault := func(points ...string) {
				t.Helper()
				if err := os.WriteFile(a.faults, []byte(strings.Join(points, " ")), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			segs := map[string][]byte{}
			// 300 KiB: a segment file; a packed point gets a 4 KiB one.
			seg := func(id string) []byte {
				size := 300 << 10
				if id == "new-packed" {
					size = 4 << 10
				}
				segs[id] = bytes.Repeat([]byte(id+" "), size/(len(id)+1))
				return segs[id]
			}
			b.start()
			a.start()
			putFile(t, a, "relayed", seg("relayed"))
			eventually(t, "a relayed it", a.relayed("relayed"))
			b.stop()
			putFile(t, a, "owed", seg("owed"))
			for _, point := range faultPoints() {
				setFault(point)
				id := "new-" + point
				out, code := putFileCode(t, a, id, seg(id))
				if code == 0 || !strings.Contains(out, "quota") || !strings.Contains(out, "injected fault at "+point) {
					t.Fatalf("put with the disk full at %s: exit %d\n%s", point, code, out)
				}
				held := map[string]bool{}
				for _, id := range a.ids() {
					held[id] = true
				}
				if held[id] || !held["owed"] || held["relayed"] != (policy == "reject") {
					t.Fatalf("after the full disk at %s a holds %v", point, a.ids())
				}
				storeClean(t, a, segs)
				if q, err := a.client.Quota(context.Background()); err != nil || q.ReservedBytes != 0 || q.Segments != int64(len(held)) {
					t.Errorf("a's quota after the full disk at %s: %+v, %v", point, q, err)
				}
			}
			evictions := regexp.MustCompile(`msg="storage full: evicted relayed segments" node=a segments=\[relayed\]`).FindAllString(a.log(), -1)
			if want := map[string]int{"reject": 0, "evict_relayed_oldest": 1}[policy]; len(evictions) != want || strings.Count(a.log(), "storage full: evicted") != want {
				t.Errorf("a logged %d evictions, want %d", strings.Count(a.log(), "storage full: evicted"), want)
			}
			setFault()
			b.start()
			for _, point := range faultPoints() {
				id := "new-" + point
				putFile(t, a, id, segs[id])
			}
			for id, content := range segs {
				eventually(t, "b holds "+id, func() bool { return b.has(id, digest(content)) })
			}
			storeClean(t, a, segs)
			a.ledgerConsistent(t)
		})
	}
}

// faultPoints are the write steps of edge/segstore/faultinject.go, in the
// order a write passes them. The store flushes a commit group with one
// syncfs only where that reports write-back errors (Linux 5.8 and later,
// edge/segstore/fssync_linux.go); elsewhere there is no syncfs to fail.
func faultPoints() []string {
	points := []string{"created", "write", "copied", "synced", "syncfs", "renamed", "dirsync", "packed"}
	var major, minor int
	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if _, serr := fmt.Sscanf(string(release), "%d.%d", &major, &minor); err != nil || serr != nil || major < 5 || major == 5 && minor < 8 {
		points = slices.DeleteFunc(points, func(p string) bool { return p == "syncfs" })
	}
	return points
}

// diskFull is the a → link → b → c cluster of TestDiskFullReceiver.
type diskFull struct {
	t       *testing.T
	policy  string
	a, b, c *node
	segs    map[string][]byte // everything ingested on a
	checked map[string]bool   // evictions already checked
}

func runDiskFull(t *testing.T, policy string) {
	f := newDiskFull(t, policy)
	a, b, c := f.a, f.b, f.c
	c.start()
	b.start()
	a.start()
	points := faultPoints()
	for i, point := range points {
		if i == 3 {
			c.stop() // from here on, what b receives stays owed to c
		}
		batch := f.batch(fmt.Sprintf("p%d", i), 10)
		// The split is by id, not by map order: each half holds one of
		// the batch's two large segments (-00 and -05). Only a segment
		// file passes every fault point (a small one received into
		// memory goes to a pack and skips created, copied, synced and
		// renamed: edge/segstore/faultinject.go), so a half of small
		// segments alone would never reach a file-only point.
		ids := slices.Sorted(maps.Keys(batch))
		half := map[string][]byte{}
		rest := map[string][]byte{}
		for n, id := range ids {
			if n < len(ids)/2 {
				half[id] = batch[id]
			} else {
				rest[id] = batch[id]
			}
		}
		ingest(t, a, half) // in flight while the disk fills
		refused := f.refusals(point)
		f.setFault(point)
		ingest(t, a, rest) // each of these reaches the full disk
		eventually(t, "b refuses a write at "+point+" with NACK quota", func() bool { return f.refusals(point) > refused })
		eventually(t, "a's ledger shows the quota refusal at "+point, func() bool { return f.aSawQuota(point) })
		f.ackedHeld()
		f.owedKept()
		f.setFault()
		for id := range batch {
			eventually(t, "a acked "+id, a.inState(id, "b", "acked"))
			if i < 3 {
				// Relayed on b, so evictable from the next fault on
				// (or already evicted by a later write of this batch
				// that found the disk full).
				relayed := b.relayed(id)
				eventually(t, "b relayed "+id, func() bool { return relayed() || f.evicted()[id] })
			}
		}
		f.ackedHeld()
		f.owedKept()
		f.idle()
		f.storeClean()
	}
	m := f.metric(b, `edged_nacks_sent_total{code="quota"}`)
	if m < len(points) {
		t.Errorf("b counted %d quota NACKs, want at least one per fault point (%d)", m, len(points))
	}
	if policy == "evict_relayed_oldest" && len(f.evicted()) == 0 {
		t.Error("b's full disk evicted nothing, though it held relayed segments")
	}

	// kill -9 of b while its disk is full, and a restart still full.
	last := f.batch("kill", 10)
	f.setFault("write")
	refused := f.refusals("write")
	ingest(t, a, last)
	eventually(t, "b refuses a write with NACK quota before the kill", func() bool { return f.refusals("write") > refused })
	b.kill()
	refused = f.refusals("write")
	b.start()
	eventually(t, "b refuses a write with NACK quota after the restart", func() bool { return f.refusals("write") > refused })
	f.ackedHeld()
	f.owedKept()
	a.stop()
	f.idle()
	f.storeClean()

	// The disk clears: everything arrives.
	f.setFault()
	c.start()
	a.start()
	for id := range f.segs {
		eventually(t, "a acked "+id, a.inState(id, "b", "acked"))
	}
	for id, content := range f.segs {
		eventually(t, "c holds "+id, func() bool { return c.has(id, digest(content)) })
		eventually(t, "b's record for c acked "+id, b.inState(id, "c", "acked"))
	}
	f.ackedHeld()
	f.storeClean()
	var gone []string
	for id, content := range f.segs {
		if !b.has(id, digest(content)) {
			gone = append(gone, id)
		}
	}
	f.evictedAll(gone, "not on b")
	evicted := f.evicted()
	if policy == "reject" && len(evicted) > 0 {
		t.Errorf("reject evicted %v", evicted)
	}
	a.ledgerConsistent(t)
	b.ledgerConsistent(t)
	t.Logf("%s: %d segments, %d evicted by b", policy, len(f.segs), len(evicted))
}

func newDiskFull(t *testing.T, policy string) *diskFull {
	t.Helper()
	cl := newCluster(t, "a", "b", "c")
	a, b, c := cl.nodes["a"], cl.nodes["b"], cl.nodes["c"]
	link, err := linkem.New(linkem.Config{Target: b.listen, Latency: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	// a → b → c: a owes b, b owes c, each accepts from the one before.
	a.peers, b.peers, c.peers = []string{"b"}, []string{"c"}, nil
	b.accept, c.accept = []string{"a"}, []string{"b"}
	a.dial = map[string]string{"b": link.Addr().String()}
	// Retried quota refusals and c's downtime must not deadletter anything.
	retry := "  backoff: {initial: 50ms, max: 200ms}\n  max_retries: 1000\n  dial_timeout: 2s\n  workers: 2\n  ack_timeout: 10s\n"
	a.relay, b.relay = retry, retry
	b.storage = "  on_full: " + policy + "\n"
	b.faults = filepath.Join(cl.dir, "b-faults")
	return &diskFull{t: t, policy: policy, a: a, b: b, c: c, segs: map[string][]byte{}, checked: map[string]bool{}}
}

// batch makes n new segments named prefix-NN: small ones, and every fifth
// larger than the store's copy buffer, so a write fails part-way through
// its content.
func (f *diskFull) batch(prefix string, n int) map[string][]byte {
	out := map[string][]byte{}
	for i := range n {
		id := fmt.Sprintf("%s-%02d", prefix, i)
		size := 4 << 10
		if i%5 == 0 {
			size = 600 << 10
		}
		out[id] = bytes.Repeat([]byte(id+" "), size/(len(id)+1))
		f.segs[id] = out[id]
	}
	return out
}

// setFault makes b's writes fail at the given points (none: stop failing).
func (f *diskFull) setFault(points ...string) {
	f.t.Helper()
	if err := os.WriteFile(f.b.faults, []byte(strings.Join(points, " ")), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// refusals counts b's logged quota NACKs of writes that failed at point.
func (f *diskFull) refusals(point string) int {
	re := regexp.MustCompile(`msg="segment refused" .*code=quota .*injected fault at ` + point + `\b`)
	return len(re.FindAllStringIndex(f.b.log(), -1))
}

// aSawQuota: some record of a for b failed with NACK quota at point.
func (f *diskFull) aSawQuota(point string) bool {
	rs, err := f.a.client.Records(context.Background(), "all")
	if err != nil {
		return false
	}
	for _, r := range rs.Records {
		if r.Peer == "b" && strings.Contains(r.LastError, `: quota: `) && strings.Contains(r.LastError, "injected fault at "+point) {
			return true
		}
	}
	return false
}

// ackedHeld: every record a holds as acked for b names a segment b holds
// with a's digest, or one b evicted after c acknowledged it.
func (f *diskFull) ackedHeld() {
	f.t.Helper()
	rs, err := f.a.client.Records(context.Background(), "acked")
	if err != nil {
		f.t.Fatal(err)
	}
	held := map[string]string{}
	for _, s := range f.b.index() {
		held[s.ID] = s.SHA256
	}
	var missing []string
	for _, r := range rs.Records {
		if r.Peer == "b" && held[r.Segment] != digest(f.segs[r.Segment]) {
			missing = append(missing, r.Segment)
		}
	}
	f.evictedAll(missing, "a holds them as acked by b, but b does not hold them")
}

// evictedAll checks that b logged every one of ids as evicted. b logs an
// eviction right after it commits, so an index read a moment earlier may
// miss a segment whose log line is still to come: wait for the lines.
func (f *diskFull) evictedAll(ids []string, why string) {
	f.t.Helper()
	if len(ids) == 0 {
		return
	}
	deadline := time.Now().Add(waitFor)
	for {
		evicted := f.evicted()
		var not []string
		for _, id := range ids {
			if !evicted[id] {
				not = append(not, id)
			}
		}
		if len(not) == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%v: %s, and b logged no eviction of them within %v", not, why, waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// owedKept: every segment b still owes c is in b's index. Records are
// read before the index, and an owed segment cannot stop being owed while
// c is down, so a segment missing here was evicted while owed.
func (f *diskFull) owedKept() {
	f.t.Helper()
	rs, err := f.b.client.Records(context.Background(), "all")
	if err != nil {
		f.t.Fatal(err)
	}
	held := map[string]bool{}
	for _, s := range f.b.index() {
		held[s.ID] = true
	}
	for _, r := range rs.Records {
		if r.Peer == "c" && r.State != "acked" && r.State != "deadletter" && !held[r.Segment] {
			f.t.Errorf("b no longer holds %s, still owed to c (record %s)", r.Segment, r.State)
		}
	}
}

var evictedLine = regexp.MustCompile(`msg="storage full: evicted relayed segments" node=b segments="?\[([^\]]*)\]`)

// evicted returns the segments b logged as evicted for room, checking
// each: c holds it with a's digest and b's record for c is acked.
func (f *diskFull) evicted() map[string]bool {
	f.t.Helper()
	out := map[string]bool{}
	for _, m := range evictedLine.FindAllStringSubmatch(f.b.log(), -1) {
		for _, id := range strings.Fields(m[1]) {
			out[id] = true
			if f.checked[id] {
				continue
			}
			f.checked[id] = true
			if f.policy != "evict_relayed_oldest" {
				f.t.Errorf("b evicted %s under %s", id, f.policy)
			}
			if r, ok := f.b.record(id, "c"); !ok || r.State != "acked" {
				f.t.Errorf("b evicted %s, but its record for c is %+v", id, r)
			}
		}
	}
	return out
}

// idle waits until b holds no reservation: no receive in progress. The
// callers have nothing more for b to receive (a stopped, or every segment
// a owes b acked), so none starts before storeClean looks.
func (f *diskFull) idle() {
	f.t.Helper()
	eventually(f.t, "b has no transfer in progress", func() bool {
		q, err := f.b.client.Quota(context.Background())
		return err == nil && q.ReservedBytes == 0 && q.ReservedSegments == 0
	})
}

// storeClean checks b's segment directory while nothing is being
// received (see storeClean).
func (f *diskFull) storeClean() {
	f.t.Helper()
	storeClean(f.t, f.b, f.segs)
}

// storeClean checks n's store on disk while nothing is being written (a
// segment file or a pack record is on disk for each index entry, and
// nothing else): no temp files, no bytes in packs that are not records,
// one segment per index entry, each with the content segs holds under
// its id.
func storeClean(t *testing.T, n *node, segs map[string][]byte) {
	t.Helper()
	disk := onDisk(t, n)
	for _, name := range disk.Temp {
		t.Errorf("%s left a temp file behind: %s", n.id, name)
	}
	for _, g := range disk.Garbage {
		t.Errorf("%s's packs hold garbage: %s", n.id, g)
	}
	for _, id := range disk.Duplicates {
		t.Errorf("%s holds %s twice on disk", n.id, id)
	}
	indexed := map[string]string{}
	for _, s := range n.index() {
		indexed[s.ID] = s.SHA256
	}
	for id, f := range disk.Segments {
		content, ok := segs[id]
		if !ok || indexed[id] == "" {
			t.Errorf("%s holds %s (%s) without an index entry", n.id, id, f.Path)
			continue
		}
		if !bytes.Equal(f.Content, content) {
			t.Errorf("%s's %s differs from what was ingested (sha256 %s)", n.id, id, digest(f.Content))
		}
		delete(indexed, id)
	}
	for id := range indexed {
		t.Errorf("%s's index names %s, which is not on disk", n.id, id)
	}
}

// onDisk reads n's store from its files (segstore.ReadDisk).
func onDisk(t *testing.T, n *node) *segstore.OnDisk {
	t.Helper()
	d, err := segstore.ReadDisk(filepath.Join(n.c.dir, "data-"+n.id))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// metric reads one counter from n's /metrics.
func (f *diskFull) metric(n *node, name string) int {
	f.t.Helper()
	m, err := n.client.Metrics(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				f.t.Fatalf("%s: %v", l, err)
			}
			return int(x)
		}
	}
	return 0
}
