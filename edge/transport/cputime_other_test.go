//go:build !unix

package transport

import "time"

// cpuTime is not measured here; the benchmark then omits its CPU figures.
func cpuTime() time.Duration { return 0 }
