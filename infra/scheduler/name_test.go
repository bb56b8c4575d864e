package scheduler_test

import (
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/relaycore"
)

func TestScheduleNameNastySources(t *testing.T) {
	long := strings.Repeat("x", relaycore.MaxPartitionLen)
	cases := []string{
		"s1", "tenant/42", "with space", "ünïcødé", "\x00\xff", "a.b-c_d",
		"../../etc/passwd", long, long[:200] + "y", "日本語", `"quoted"`, "a\nb",
	}
	seen := map[string]string{}
	for _, src := range cases {
		for _, due := range []int64{0, 1, -1, 1796040000, 1<<63 - 1, -1 << 63} {
			name := scheduler.ScheduleName(relaycore.Partition(src), due)
			if !scheduler.ValidName(name) {
				t.Errorf("ScheduleName(%q, %d) = %q breaks Scheduler's name rules", src, due, name)
			}
			if prev, dup := seen[name]; dup {
				t.Errorf("ScheduleName collision: %q for %q and %q@%d", name, prev, src, due)
			}
			seen[name] = src
		}
	}
	// Sources that sanitize to the same prefix must still differ.
	a := scheduler.ScheduleName("a/b", 7)
	b := scheduler.ScheduleName("a_b", 7)
	if a == b {
		t.Errorf("a/b and a_b share name %q", a)
	}
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{
		"": false, "a": true, strings.Repeat("a", 64): true, strings.Repeat("a", 65): false,
		"a/b": false, "a b": false, "A-z_0.9": true,
	} {
		if got := scheduler.ValidName(s); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", s, got, want)
		}
	}
}

// FuzzScheduleName checks the name rules and injectivity on (source, due)
// for arbitrary source ids.
func FuzzScheduleName(f *testing.F) {
	f.Add("s1", int64(1796040000), "s2", int64(1796040000))
	f.Add("a/b", int64(7), "a_b", int64(7))
	f.Add("", int64(0), "src", int64(0))
	f.Add(strings.Repeat("z", 300), int64(-1), strings.Repeat("z", 301), int64(-1))
	f.Fuzz(func(t *testing.T, s1 string, d1 int64, s2 string, d2 int64) {
		n1 := scheduler.ScheduleName(relaycore.Partition(s1), d1)
		n2 := scheduler.ScheduleName(relaycore.Partition(s2), d2)
		if !scheduler.ValidName(n1) {
			t.Fatalf("ScheduleName(%q, %d) = %q is not a valid name", s1, d1, n1)
		}
		if n1 != scheduler.ScheduleName(relaycore.Partition(s1), d1) {
			t.Fatalf("ScheduleName(%q, %d) is not deterministic", s1, d1)
		}
		if (s1 == s2 && d1 == d2) != (n1 == n2) {
			t.Fatalf("(%q,%d)->%q and (%q,%d)->%q: names equal iff inputs equal is broken", s1, d1, n1, s2, d2, n2)
		}
	})
}
