package dynamo

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/relay-dev/relay/relaycore"
)

// The key encoding must be valid UTF-8, round-trip, and keep byte order;
// these are the properties DynamoDB's S sort order needs.
func FuzzKeyEncoding(f *testing.F) {
	for _, s := range [][2]string{
		{"a", "a\x00"}, {"\x7f", "é"}, {"\xff", "\U0001F600"}, {"a\xff", "ab"}, {"", "\x80"}, {"os", "r/0000000000000001"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := encodeKey(a), encodeKey(b)
		if !utf8.ValidString(ea) {
			t.Fatalf("encodeKey(%q) = %q is not UTF-8", a, ea)
		}
		if len(ea) != encodedLen(a) {
			t.Fatalf("encodedLen(%q) = %d, encoding has %d bytes", a, encodedLen(a), len(ea))
		}
		if d, err := decodeKey(ea); err != nil || d != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, d, err)
		}
		if strings.Compare(a, b) != strings.Compare(ea, eb) {
			t.Fatalf("order of %q, %q is %d; encoded %q, %q: %d", a, b, strings.Compare(a, b), ea, eb, strings.Compare(ea, eb))
		}
	})
}

func TestKeyEncodingKeepsASCII(t *testing.T) {
	for _, k := range []string{"os", "rs", "alarm", "r/00000000000000ff", "_relay/rh/source-1"} {
		if encodeKey(k) != k {
			t.Errorf("encodeKey(%q) = %q; ASCII keys must be stored as they are", k, encodeKey(k))
		}
	}
	if got := encodeKey("é"); got != "Ã©" {
		t.Errorf(`encodeKey("é") = %q, want "Ã©" (each byte one code point)`, got)
	}
	if _, err := decodeKey("日"); err == nil {
		t.Error("decodeKey accepted a code point above U+00FF")
	}
}

func TestNumberSize(t *testing.T) {
	for _, c := range []struct {
		n    string
		want int
	}{
		{"0", 2}, {"1", 2}, {"12", 2}, {"123", 3}, {"1764000000000", 3}, {"1764123456789", 8},
		{"-9223372036854775808", 11}, {"100", 2}, {"0.0012", 2},
	} {
		if got := numberSize(c.n); got != c.want {
			t.Errorf("numberSize(%q) = %d, want %d", c.n, got, c.want)
		}
	}
	// itemOverhead's 11 bytes for due cover every int64.
	if got := numberSize(int64Digits(-9223372036854775808)); got > 11 {
		t.Errorf("an int64 due takes %d bytes, itemOverhead allows 11", got)
	}
}

// Guarded actions come first in precondition order, so an endpoint that
// reports only the first failing action names the lowest index.
func TestPlanOrder(t *testing.T) {
	b := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: "g2", Absent: true}, {Key: "w1", Absent: true}, {Key: "g1", Absent: true}, {Key: "g2", Absent: true}},
		Writes:        []relaycore.Write{{Key: "w0"}, {Key: "w1"}},
	}
	var got []string
	for _, it := range plan(b) {
		got = append(got, it.key)
	}
	if strings.Join(got, ",") != "g2,w1,g1,w0" {
		t.Fatalf("plan order %v, want g2,w1,g1,w0", got)
	}
	if it := plan(b)[0]; len(it.pcs) != 2 || it.pcs[0] != 0 || it.pcs[1] != 3 || it.write != nil {
		t.Fatalf("g2 carries %v (write %v), want preconditions 0 and 3 as a ConditionCheck", it.pcs, it.write)
	}
}

func TestBackoffBounded(t *testing.T) {
	s := New(nil, "t", Options{Retry: RetryPolicy{Base: time.Millisecond, Max: 8 * time.Millisecond}, Jitter: func() float64 { return 0.999 }})
	for n := 1; n < 100; n++ {
		if d := s.backoff("tok", n); d > 8*time.Millisecond || d < time.Millisecond/2 {
			t.Fatalf("backoff(%d) = %v outside [0.5ms, 8ms]", n, d)
		}
	}
	// Without a jitter source the token decides, deterministically.
	s = New(nil, "t", Options{})
	if first, second := s.backoff("a", 3), s.backoff("a", 3); first != second {
		t.Fatal("token jitter is not deterministic")
	}
}
