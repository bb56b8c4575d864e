package relaycore

import (
	"strings"
	"testing"
)

// Takedown requests are outside input: decoding never panics, and whatever
// decodes is valid and re-encodes to a request that decodes equal.
func FuzzDecodeTakedown(f *testing.F) {
	f.Add([]byte(`{"v":1,"content_id":"seg-9f2c","late_holder":"edge-7","requested_ms":1800000000123,"reason":"dmca 2026-118"}`))
	f.Add([]byte(`{"v":1,"content_id":"a","late_holder":"b","requested_ms":1,"reason":"x"} `))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := DecodeTakedown(raw)
		if err != nil {
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("decoded an invalid request: %v", err)
		}
		enc, err := encodeTakedown(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeTakedown(enc)
		if err != nil || again != req {
			t.Fatalf("re-encoded request does not round-trip: %+v vs %+v (%v)", again, req, err)
		}
		if k := takedownKey(req); strings.Count(k, "/") != 3 {
			t.Fatalf("key %q does not split into content, holder and time", k)
		}
	})
}
