package segstore

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// OnDisk is what a store's directory holds, read from its files alone
// (no index): for tests of real edged processes, which check that what
// is on disk is exactly what the index says, and for operators looking
// at a store by hand. Read it while nothing is being written.
type OnDisk struct {
	// Segments holds every segment file and every pack record, by id,
	// with where its content is. An id found twice is in Duplicates.
	Segments map[string]Found
	// Temp names leftover temp files in segments/.
	Temp []string
	// Garbage describes bytes in packs that are neither zero nor a
	// record ("<pack> at <offset>: <why>").
	Garbage    []string
	Duplicates []string
}

// Found is one segment on disk.
type Found struct {
	Path    string // the segment file, or the pack
	Off     int64  // where the content starts in Path
	Content []byte
	Packed  bool
}

// ReadDisk reads the store under dir (see OnDisk).
func ReadDisk(dir string) (*OnDisk, error) {
	d := &OnDisk{Segments: map[string]Found{}}
	add := func(id string, f Found) {
		if _, dup := d.Segments[id]; dup {
			d.Duplicates = append(d.Duplicates, id)
		}
		d.Segments[id] = f
	}
	segs := filepath.Join(dir, "segments")
	des, err := os.ReadDir(segs)
	if err != nil {
		return nil, err
	}
	for _, de := range des {
		name := de.Name()
		switch {
		case strings.HasPrefix(name, tmpPrefix):
			d.Temp = append(d.Temp, name)
		case de.Type().IsRegular() && ValidID(name) == nil:
			path := filepath.Join(segs, name)
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			add(name, Found{Path: path, Content: b})
		}
	}
	packs := filepath.Join(dir, packDirName)
	des, err = os.ReadDir(packs)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	names := map[string]bool{}
	for _, de := range des {
		if _, ok := packSeq(de.Name()); ok {
			names[de.Name()] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		if err := d.readPack(filepath.Join(packs, name), add); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (d *OnDisk) readPack(path string, add func(string, Found)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return walkPack(f, fi.Size(), func(off int64, h recordHeader) error {
		content := make([]byte, h.size)
		if _, err := io.ReadFull(io.NewSectionReader(f, off+h.headerLen, h.size), content); err != nil {
			return err
		}
		add(h.id, Found{Path: path, Off: off + h.headerLen, Content: content, Packed: true})
		return nil
	}, func(off int64, why error) error {
		d.Garbage = append(d.Garbage, fmt.Sprintf("%s at %d: %v", filepath.Base(path), off, why))
		return nil
	})
}
