package segstore

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// Digest tags are linux extended attributes; these tests set and remove
// them directly.

// TestRebuildFromFiles: a database without an index (the damaged one was
// set aside) gets its index back from the segment files. A file whose
// content matches its digest tag is rebuilt with the tag's source; one
// whose content does not is quarantined; one without a tag is indexed
// under its content's digest and reported unverified; temp files go.
func TestRebuildFromFiles(t *testing.T) {
	f := newStore(t, "", testOpts)
	tagged, flipped, untagged := content(3000, 1), content(4000, 2), content(5000, 3)
	put(t, f.s, "tagged", tagged) // source peer-x
	put(t, f.s, "flipped", flipped)
	if _, err := f.s.Write("untagged", int64(len(untagged)), digest(untagged), bytes.NewReader(untagged), ""); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(f.dir, "segments")
	flipByte(t, filepath.Join(seg, "flipped"), 17)
	must(t, syscall.Removexattr(filepath.Join(seg, "untagged"), tagAttr))
	must(t, os.WriteFile(filepath.Join(seg, tmpPrefix+"y-1"), []byte("partial"), 0o600))
	before, err := os.Stat(filepath.Join(seg, "tagged"))
	must(t, err)

	rep := reopen(t, f, "new.db", testOpts)
	if !slices.Equal(rep.Rebuilt, []string{"tagged", "untagged"}) || !slices.Equal(rep.Unverified, []string{"untagged"}) ||
		len(rep.Quarantined) != 1 || len(rep.RemovedTemp) != 1 || len(rep.RemovedOrphans) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if !bytes.Equal(quarantined(t, f, rep, "flipped")[18:], flipped[18:]) {
		t.Fatal("quarantined file differs")
	}
	e, err := f.s.Stat("tagged")
	must(t, err)
	if e.SHA256 != digest(tagged) || e.Size != int64(len(tagged)) || e.Source != "peer-x" || e.Rebuilt != RebuiltFromTag ||
		e.Relayed || !e.Received.Equal(before.ModTime().UTC()) {
		t.Fatalf("tagged entry %+v", e)
	}
	e, err = f.s.Stat("untagged")
	must(t, err)
	if e.SHA256 != digest(untagged) || e.Source != "" || e.Rebuilt != RebuiltFromContent {
		t.Fatalf("untagged entry %+v", e)
	}
	if u := f.s.Usage(); u.Bytes != int64(len(tagged)+len(untagged)) || u.Segments != 2 {
		t.Fatalf("usage %+v", u)
	}
	// A rebuilt index is an ordinary index at the next start.
	rep = reopen(t, f, "new.db", testOpts)
	if len(rep.Rebuilt)+len(rep.Quarantined)+len(rep.RemovedOrphans) != 0 {
		t.Fatalf("second start repaired %+v", rep)
	}
	if e, _ := f.s.Stat("tagged"); e.Rebuilt != RebuiltFromTag {
		t.Fatalf("provenance lost: %+v", e)
	}
}

// TestRebuildGarbledTag: a tag that does not decode is damage too.
func TestRebuildGarbledTag(t *testing.T) {
	f := newStore(t, "", testOpts)
	put(t, f.s, "s", content(100, 1))
	must(t, syscall.Setxattr(filepath.Join(f.dir, "segments", "s"), tagAttr, []byte("{not json"), 0))
	rep := reopen(t, f, "new.db", testOpts)
	if len(rep.Rebuilt) != 0 || len(rep.Quarantined) != 1 {
		t.Fatalf("report %+v", rep)
	}
}
