package main

import (
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

// TestPacksLine: edgectl storage says whether packing is on, and lists
// packs that remain after it was turned off (they stay readable until
// their segments are evicted).
func TestPacksLine(t *testing.T) {
	for _, c := range []struct {
		p    rpc.Packs
		want string
	}{
		{rpc.Packs{}, "off (storage.pack_max_bytes: 0, or the file system cannot punch holes)"},
		{rpc.Packs{Files: 1, Segments: 3, RecordBytes: 12_672, DiskBytes: 16_384},
			"off (storage.pack_max_bytes: 0, or the file system cannot punch holes); files 1, segments 3, records 12672 bytes, on disk 16384 bytes"},
		{rpc.Packs{Packing: true, MaxBytes: 65536},
			"on (segments up to 65536 bytes); files 0, segments 0, records 0 bytes, on disk 0 bytes"},
	} {
		if got := packsLine(c.p); got != c.want {
			t.Errorf("packsLine(%+v) = %q, want %q", c.p, got, c.want)
		}
	}
}
