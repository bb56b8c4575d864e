//go:build !linux

package segstore

import "os"

// startWriteback does nothing here: sync_file_range(2) is Linux's; the
// commit's fsync writes everything, as without the hint.
func startWriteback(*os.File, int64, int64) {}
