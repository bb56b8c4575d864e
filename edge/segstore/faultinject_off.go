//go:build !faultinject

package segstore

// injectFaults does nothing: fault injection exists only in binaries
// built with the faultinject tag (faultinject.go).
func (s *Store) injectFaults() {}
