package config

import (
	"errors"
	"testing"
)

// FuzzParse: operator input must never panic the parser, and whatever it
// accepts must pass Validate (Parse cannot return an invalid config).
func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte(minimal))
	f.Add([]byte(minimal + "relay: {backoff: {initial: 1s, max: 1ms}}\n"))
	f.Add([]byte("known_peers: [{id: &a x, address: *a}]\n"))
	f.Add([]byte("storage: {quota_bytes: 9223372036854775807TiB}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var ps Problems
			if errors.As(err, &ps) && len(ps) == 0 {
				t.Fatal("empty Problems returned as an error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted an invalid config: %v", err)
		}
	})
}
