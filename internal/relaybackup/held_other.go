//go:build !unix

package relaybackup

// heldOpen cannot tell on this platform; bbolt's lock is a flock only on
// unix systems.
func heldOpen(string) (bool, error) { return false, nil }
