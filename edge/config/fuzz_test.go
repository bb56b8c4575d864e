package config

import (
	"errors"
	"strings"
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
	f.Add([]byte("node_id: [a]\nrelay: {workers: [1], backoff: x}\nknown_peers: [x, {id: b}, [1]]\naccept_from: [{}]\nrpc: {ingest_dirs: [[d]]}\n"))
	f.Add([]byte("relay: &r {workers: [1]}\nstorage: *r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			// What the schema check lets through must decode: the pruned
			// document failing to decode is a bug (see decode).
			if strings.Contains(err.Error(), "decode config:") {
				t.Fatalf("schema check admitted what does not decode: %v", err)
			}
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
