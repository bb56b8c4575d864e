package segstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// packModes are syncModes with small segments packed.
var packModes = func() []storeMode {
	var out []storeMode
	for _, m := range syncModes {
		m.opts.PackMaxBytes = DefaultPackMaxBytes
		m.name = "packed_" + m.name
		out = append(out, m)
	}
	return out
}()

var packOpts = packModes[0].opts

// newPackStore is newStore with packs, skipping where the file system
// cannot punch holes (the store then keeps files, tested elsewhere).
func newPackStore(t *testing.T, dir string, opt Options) *fixture {
	t.Helper()
	f := newStore(t, dir, opt)
	if !f.s.Packing() {
		t.Skip("file system cannot punch holes: no packs")
	}
	return f
}

// TestPackedWriteReadEvict: small segments go into one pack (no segment
// files), read back intact, and survive a reopen; large ones stay files.
func TestPackedWriteReadEvict(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	want := map[string][]byte{}
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		want[id] = content(100+i*997, byte(i))
		e := put(t, f.s, id, want[id])
		if !e.Packed() {
			t.Fatalf("%s (%d bytes) not packed", id, e.Size)
		}
	}
	big := content(DefaultPackMaxBytes+1, 9)
	if e := put(t, f.s, "big", big); e.Packed() {
		t.Fatal("a segment over PackMaxBytes was packed")
	}
	des, _ := os.ReadDir(filepath.Join(f.dir, "segments"))
	if len(des) != 1 || des[0].Name() != "big" {
		t.Fatalf("segments/ holds %v, want only big", des)
	}
	for id, b := range want {
		if !bytes.Equal(read(t, f.s, id), b) {
			t.Fatalf("%s read back differs", id)
		}
	}
	must(t, f.s.Evict("s3"))
	must(t, f.s.Evict("s4"))
	checkInvariant(t, f)
	rep := reopen(t, f, "edged.db", packOpts)
	if len(rep.DroppedEntries)+len(rep.Quarantined)+len(rep.RemovedOrphans) != 0 {
		t.Fatalf("clean reopen repaired: %+v", rep)
	}
	for id, b := range want {
		if id == "s3" || id == "s4" {
			continue
		}
		if !bytes.Equal(read(t, f.s, id), b) {
			t.Fatalf("%s read back differs after reopen", id)
		}
	}
	// The reopened store appends to a new pack; the old one is sealed and
	// removed when its last record goes.
	put(t, f.s, "new", content(50, 1))
	for id := range want {
		if id != "s3" && id != "s4" {
			must(t, f.s.Evict(id))
		}
	}
	if _, err := os.Stat(filepath.Join(f.dir, packDirName, packName(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sealed pack without records still there: %v", err)
	}
}

// TestPackEvictFreesBlocks: evicting records gives their blocks back to
// the file system, including blocks shared by neighbouring records that
// were evicted one after the other.
func TestPackEvictFreesBlocks(t *testing.T) {
	f := newPackStore(t, "", Options{QuotaBytes: 1 << 30, QuotaSegments: 1000, MaxSegmentBytes: 1 << 20, PackMaxBytes: DefaultPackMaxBytes})
	for i := range 64 {
		put(t, f.s, fmt.Sprintf("s%02d", i), content(3000, byte(i))) // records straddle blocks
	}
	before := f.s.PackStats()
	if !before.Packing || before.Files != 1 || before.Records != 64 || before.DiskBytes < before.RecordBytes || before.RecordBytes < 64*3000 {
		t.Fatalf("pack stats %+v", before)
	}
	for i := range 63 {
		must(t, f.s.Evict(fmt.Sprintf("s%02d", i)))
	}
	after := f.s.PackStats()
	if after.DiskBytes > 2*4096 || after.Files != 1 || after.Records != 1 {
		t.Fatalf("after evicting 63 of 64 records: %+v (before %+v)", after, before)
	}
	checkInvariant(t, f)
}

// TestPackReaderDefersPunch: a record evicted while a Reader has it open
// reads whole to the end, and is punched when the reader closes.
func TestPackReaderDefersPunch(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	b := content(5000, 3)
	put(t, f.s, "a", b)
	put(t, f.s, "b", content(5000, 4))
	r, _, err := f.s.Open("a")
	if err != nil {
		t.Fatal(err)
	}
	must(t, f.s.Evict("a"))
	must(t, f.s.Evict("b")) // its dead range must stop at a's record
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read of an evicted record while open: %v, equal %v", err, bytes.Equal(got, b))
	}
	must(t, r.Close())
	checkInvariant(t, f) // a's bytes are zero now
}

// TestPackDiskFullMidRecord: the disk refusing a record's append halfway
// (ENOSPC) fails that segment with ErrQuota and cuts the pack back; the
// next record follows the last good one.
func TestPackDiskFullMidRecord(t *testing.T) {
	opt := packOpts
	opt.WrapTemp = func(id string, w io.Writer) io.Writer {
		if id == "full" {
			return &errWriter{w: w, n: 100, err: syscall.ENOSPC}
		}
		return w
	}
	f := newPackStore(t, "", opt)
	put(t, f.s, "a", content(1000, 1))
	b := content(1000, 2)
	if _, err := f.s.Write("full", 1000, digest(b), bytes.NewReader(b), ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("err = %v, want ErrQuota", err)
	}
	put(t, f.s, "c", content(1000, 3))
	checkInvariant(t, f)
}

// errWriter passes n bytes to w, then fails with err.
type errWriter struct {
	w   io.Writer
	n   int
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if len(p) <= e.n {
		e.n -= len(p)
		return e.w.Write(p)
	}
	k, _ := e.w.Write(p[:e.n])
	e.n = 0
	return k, e.err
}

// TestPackRebuild: with the index lost, Open rebuilds the packed entries
// from the records (RebuiltFromTag, same digests and sources); evicted
// records do not come back; a record whose content was damaged is
// quarantined with its bytes; a torn tail is quarantined and cut off.
func TestPackRebuild(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	for i := range 8 {
		put(t, f.s, fmt.Sprintf("s%d", i), content(2000+i, byte(i)))
	}
	must(t, f.s.Evict("s2"))
	must(t, f.s.Evict("s5"))
	bad, err := f.s.Stat("s6")
	must(t, err)
	path := filepath.Join(f.dir, packDirName, bad.loc.pack)
	flipByte(t, path, bad.loc.off+bad.loc.len-20)
	// A torn append: a header with half its content.
	torn := encodeRecord(Entry{ID: "torn", Size: 4000, SHA256: digest(content(4000, 1))}, content(4000, 1))
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = fh.Write(torn[:2000])
	must(t, err)
	must(t, fh.Close())

	rep := reopen(t, f, "fresh.db", packOpts)
	slices.Sort(rep.Rebuilt)
	if want := []string{"s0", "s1", "s3", "s4", "s7"}; !slices.Equal(rep.Rebuilt, want) {
		t.Fatalf("rebuilt %v, want %v (report %+v)", rep.Rebuilt, want, rep)
	}
	for _, id := range rep.Rebuilt {
		e, err := f.s.Stat(id)
		must(t, err)
		var i int
		fmt.Sscanf(id, "s%d", &i)
		if e.Rebuilt != RebuiltFromTag || e.Source != "peer-x" || e.SHA256 != digest(content(2000+i, byte(i))) {
			t.Fatalf("rebuilt entry %+v", e)
		}
	}
	if len(rep.Quarantined) != 2 {
		t.Fatalf("quarantined %+v, want s6 and the torn tail", rep.Quarantined)
	}
	if q := quarantined(t, f, rep, "s6"); int64(len(q)) != bad.loc.len {
		t.Fatalf("s6 quarantined with %d bytes, record has %d", len(q), bad.loc.len)
	}
	checkInvariant(t, f)
}

// TestPackReconcile: at a start with the index intact, a record whose
// header no longer matches its entry is quarantined, entries of a missing
// pack are dropped, bytes no entry names are punched or cut, and unknown
// files in packs/ are left alone.
func TestPackReconcile(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	put(t, f.s, "good", content(1000, 1))
	put(t, f.s, "hdr", content(1000, 2))
	e, err := f.s.Stat("hdr")
	must(t, err)
	path := filepath.Join(f.dir, packDirName, e.loc.pack)
	flipByte(t, path, e.loc.off+60) // in the id
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = fh.Write(bytes.Repeat([]byte{0xee}, 5000)) // an unindexed tail
	must(t, err)
	must(t, fh.Close())
	must(t, os.WriteFile(filepath.Join(f.dir, packDirName, "notes"), []byte("keep"), 0o600))
	rep := reopen(t, f, "edged.db", packOpts)
	if len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "hdr" || !slices.Equal(rep.DroppedEntries, []string{"hdr"}) ||
		!slices.Equal(rep.Unknown, []string{packDirName + "/notes"}) {
		t.Fatalf("report %+v", rep)
	}
	if !bytes.Equal(read(t, f.s, "good"), content(1000, 1)) {
		t.Fatal("good segment damaged")
	}
	checkInvariant(t, f)

	// An entry that names another segment's (valid) record.
	put(t, f.s, "x", content(700, 4))
	put(t, f.s, "y", content(700, 5))
	x, err := f.s.Stat("x")
	must(t, err)
	y, err := f.s.Stat("y")
	must(t, err)
	y.loc = x.loc
	v, err := y.encode()
	must(t, err)
	must(t, f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(indexBucket).Put([]byte("y"), v) }))
	rep = reopen(t, f, "edged.db", packOpts)
	if len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "y" || !slices.Equal(rep.DroppedEntries, []string{"y"}) {
		t.Fatalf("report %+v", rep)
	}
	if !bytes.Equal(read(t, f.s, "x"), content(700, 4)) {
		t.Fatal("x damaged")
	}
	checkInvariant(t, f)

	// A missing pack: its entries are dropped.
	put(t, f.s, "later", content(10, 3))
	must(t, os.Remove(filepath.Join(f.dir, packDirName, e.loc.pack)))
	rep = reopen(t, f, "edged.db", packOpts)
	if !slices.Equal(rep.DroppedEntries, []string{"good"}) {
		t.Fatalf("report %+v", rep)
	}
	checkInvariant(t, f)
}

// TestPackVerifyOnOpen: with VerifyOnOpen a record whose content changed
// after its commit is quarantined at the next start.
func TestPackVerifyOnOpen(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	put(t, f.s, "a", content(3000, 1))
	put(t, f.s, "b", content(3000, 2))
	e, err := f.s.Stat("a")
	must(t, err)
	flipByte(t, filepath.Join(f.dir, packDirName, e.loc.pack), e.loc.off+e.loc.len-100)
	opt := packOpts
	opt.VerifyOnOpen = true
	rep := reopen(t, f, "edged.db", opt)
	if len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "a" || rep.Verified != 2 {
		t.Fatalf("report %+v", rep)
	}
	checkInvariant(t, f)
}

// TestPackedReadableWithoutPacking: a store reopened with packing off
// still serves and evicts its packed segments, and writes files.
func TestPackedReadableWithoutPacking(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	put(t, f.s, "p", content(500, 1))
	reopen(t, f, "edged.db", testOpts)
	if !bytes.Equal(read(t, f.s, "p"), content(500, 1)) {
		t.Fatal("packed segment unreadable without packing")
	}
	if e := put(t, f.s, "f", content(500, 2)); e.Packed() {
		t.Fatal("packed with packing off")
	}
	must(t, f.s.Evict("p"))
	checkInvariant(t, f)
}

// TestPackStageBudget: small segments beyond the receive memory budget
// go through temp files, and every one commits.
func TestPackStageBudget(t *testing.T) {
	f := newPackStore(t, "", Options{QuotaBytes: 1 << 30, QuotaSegments: 1000, MaxSegmentBytes: 1 << 20, PackMaxBytes: DefaultPackMaxBytes})
	held := f.s.mem.size - 1000 // as if other receives held it
	if !f.s.mem.tryTake(held) {
		t.Fatal("budget not free")
	}
	if e := put(t, f.s, "fits", content(1000, 1)); !e.Packed() {
		t.Fatal("segment within the budget not packed")
	}
	if e := put(t, f.s, "over", content(1001, 2)); e.Packed() {
		t.Fatal("segment over the budget packed")
	}
	f.s.mem.give(held)
	if u := f.s.mem.inUse(); u != 0 {
		t.Fatalf("receive memory in use after the commits: %d", u)
	}
}

// TestPackConcurrentWriters: many concurrent writers and evictions on
// packs keep the invariant (run with -race).
func TestPackConcurrentWriters(t *testing.T) {
	f := newPackStore(t, "", Options{QuotaBytes: 1 << 30, QuotaSegments: 10000, MaxSegmentBytes: 1 << 20, PackMaxBytes: DefaultPackMaxBytes})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				id := fmt.Sprintf("w%d-%d", w, i)
				b := content(100+w*300+i, byte(w+i))
				if _, err := f.s.Write(id, int64(len(b)), digest(b), bytes.NewReader(b), ""); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := f.s.Evict(id); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	checkInvariant(t, f)
}

// FuzzRecordHeader: parsing arbitrary bytes never panics, and whatever
// parses re-encodes to the same header.
func FuzzRecordHeader(f *testing.F) {
	f.Add(encodeRecord(Entry{ID: "seg-1", Size: 3, SHA256: digest([]byte("abc")), Source: "peer"}, []byte("abc")))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseRecordHeader(b)
		if err != nil {
			return
		}
		re := make([]byte, h.headerLen)
		putRecordHeader(re, Entry{ID: h.id, SHA256: h.sha256, Source: h.source, Received: h.received}, h.size)
		if !bytes.Equal(re, b[:h.headerLen]) {
			t.Fatalf("re-encoded header %x, parsed from %x", re, b[:h.headerLen])
		}
		if h.headerLen != recordHeaderLen(h.id, h.source) {
			t.Fatalf("header length %d, want %d", h.headerLen, recordHeaderLen(h.id, h.source))
		}
	})
}

// TestCheckIndexPackedEntries: the daemon's start-up check of the
// database accepts packed entries and refuses ones whose pack name or
// record could not have been written (a damaged database, set aside and
// rebuilt rather than trusted to name files).
func TestCheckIndexPackedEntries(t *testing.T) {
	f := newPackStore(t, "", packOpts)
	put(t, f.s, "a", content(100, 1))
	must(t, f.db.View(CheckIndex))
	e, err := f.s.Stat("a")
	must(t, err)
	good := e
	for name, mod := range map[string]func(*Entry){
		"pack path": func(e *Entry) { e.loc.pack = "../edged.db" },
		"offset":    func(e *Entry) { e.loc.off = 3 },
		"length":    func(e *Entry) { e.loc.len = 8 },
		"negative":  func(e *Entry) { e.loc.off = -8 },
	} {
		bad := good
		mod(&bad)
		v, err := bad.encode()
		must(t, err)
		must(t, f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(indexBucket).Put([]byte("a"), v) }))
		if err := f.db.View(CheckIndex); err == nil {
			t.Errorf("%s: damaged entry %+v accepted", name, bad.loc)
		}
	}
	v, err := good.encode()
	must(t, err)
	must(t, f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(indexBucket).Put([]byte("a"), v) }))
}
