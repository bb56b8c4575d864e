package takedown_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/takedown"
)

var digest = strings.Repeat("ab", 32)

func sample() takedown.Receipt {
	return takedown.Receipt{
		Request:   "seg-9f2c/edge-b/0001800000000123",
		ContentID: "seg-9f2c",
		SHA256:    digest,
		Node:      "edge-b",
		EvictedAt: time.Date(2026, 12, 1, 23, 40, 5, 120, time.UTC),
	}
}

// The signed bytes of a receipt, exactly: what another implementation must
// produce to sign or check one.
func ExampleReceipt_Canonical() {
	r := takedown.Receipt{
		Request:   "req-1",
		ContentID: "seg-9f2c",
		SHA256:    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		Node:      "edge-b",
		EvictedAt: time.Date(2026, 12, 1, 23, 40, 5, 120, time.FixedZone("CET", 3600)),
	}
	b, _ := r.Canonical()
	fmt.Print(string(b))
	// Output:
	// relay-takedown-receipt/1
	// request=req-1
	// content_id=seg-9f2c
	// sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
	// node=edge-b
	// evicted_at=2026-12-01T22:40:05.000000120Z
}

func TestParseRoundTrip(t *testing.T) {
	b, err := sample().Canonical()
	if err != nil {
		t.Fatal(err)
	}
	got, err := takedown.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.EvictedAt.Equal(sample().EvictedAt) || got.Request != sample().Request || got.ContentID != sample().ContentID ||
		got.SHA256 != digest || got.Node != "edge-b" {
		t.Fatalf("round trip: %+v", got)
	}
}

func TestParseRefusesNonCanonical(t *testing.T) {
	good, _ := sample().Canonical()
	s := string(good)
	for name, in := range map[string]string{
		"no final break":    strings.TrimSuffix(s, "\n"),
		"extra line":        s + "x=y\n",
		"blank line":        s + "\n",
		"crlf":              strings.ReplaceAll(s, "\n", "\r\n"),
		"version 2":         strings.Replace(s, "receipt/1", "receipt/2", 1),
		"keys swapped":      strings.Replace(strings.Replace(s, "request=", "XX=", 1), "node=", "request=", 1),
		"upper digest":      strings.Replace(s, digest, strings.ToUpper(digest), 1),
		"short digest":      strings.Replace(s, digest, digest[:62], 1),
		"local time":        strings.Replace(s, "Z\n", "+00:00\n", 1),
		"fewer digits":      strings.Replace(s, ".000000120Z", ".00000012Z", 1),
		"space in request":  strings.Replace(s, "request=seg", "request= seg", 1),
		"dot node":          strings.Replace(s, "node=edge-b", "node=.edge-b", 1),
		"empty content":     strings.Replace(s, "content_id=seg-9f2c", "content_id=", 1),
		"content with '/'":  strings.Replace(s, "content_id=seg-9f2c", "content_id=a/b", 1),
		"request too long":  strings.Replace(s, "request=seg", "request="+strings.Repeat("r", 257), 1),
		"year 10000":        strings.Replace(s, "2026-", "10000-", 1),
		"nothing":           "",
		"only version line": takedown.Version1 + "\n",
	} {
		if _, err := takedown.Parse([]byte(in)); !errors.Is(err, takedown.ErrMalformed) {
			t.Errorf("%s: Parse = %v, want ErrMalformed", name, err)
		}
	}
}
