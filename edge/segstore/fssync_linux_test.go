package segstore

import "testing"

// TestSyncModeChosen: on Linux 5.8 or later (this machine's kernel is
// checked) a Store syncs the file system per group unless told to fsync
// each file.
func TestSyncModeChosen(t *testing.T) {
	f := newStore(t, "", testOpts)
	if want := syncfsReportsErrors(); (f.s.fsSync != nil) != want {
		t.Fatalf("syncfs in use: %v, want %v", f.s.fsSync != nil, want)
	}
	g := newStore(t, "", syncModes[1].opts)
	if g.s.fsSync != nil {
		t.Fatal("FsyncEachFile still syncs the file system")
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"5.8.0", true}, {"5.7.19", false}, {"6.1.0-18-amd64", true}, {"5.10", true}, {"5.8-rc1", true},
		{"4.19.0-rpi", false}, {"5.15.0-1034-raspi", true}, {"10.0", true}, {"", false}, {"x.y", false}, {"5", false},
	} {
		if got := kernelAtLeast(tc.release, 5, 8); got != tc.want {
			t.Errorf("kernelAtLeast(%q) = %v, want %v", tc.release, got, tc.want)
		}
	}
}
