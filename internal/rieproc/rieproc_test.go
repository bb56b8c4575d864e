//go:build unix

package rieproc

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func emulator(t *testing.T) string {
	t.Helper()
	p := os.Getenv("RELAY_RIE")
	if p == "" {
		t.Skip("RELAY_RIE is not set (make test sets it to the pinned emulator)")
	}
	return p
}

// The invariant: a port another process holds when the emulator binds it
// does not fail Start; the emulator is started again on fresh ports and
// Start returns only once both of its servers listen. The emulator starts
// the bootstrap at the first invocation, so /bin/true serves as one.
func TestStartSurvivesATakenPort(t *testing.T) {
	rie := emulator(t)
	for _, which := range []string{"invocation", "runtime API"} {
		t.Run(which, func(t *testing.T) {
			held, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			// The first attempt's two picks: the held port in the slot
			// under test.
			picks := 0
			pickAddr = func() (string, error) {
				picks++
				if (which == "invocation" && picks == 1) || (which == "runtime API" && picks == 2) {
					return held.Addr().String(), nil
				}
				return freeAddr()
			}
			defer func() { pickAddr = freeAddr }()
			out := &Buffer{}
			p, err := Start(Config{RIE: rie, Bootstrap: "/bin/true", Home: t.TempDir(), Timeout: 5 * time.Second, Output: out})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer p.Stop()
			if picks != 4 {
				t.Errorf("%d addresses picked, want 4 (two attempts)", picks)
			}
			if !strings.Contains(out.String(), "address already in use") {
				t.Errorf("the first emulator did not lose its port:\n%s", out.String())
			}
			if strings.Contains(p.URL, held.Addr().String()) {
				t.Errorf("URL %s is on the held port", p.URL)
			}
			host := strings.TrimSuffix(strings.TrimPrefix(p.URL, "http://"), "/2015-03-31/functions/function/invocations")
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatalf("the emulator does not listen at %s: %v", host, err)
			}
			c.Close()
		})
	}
}

// An emulator that exits for any other reason is an error at once, with
// its output, and is not started again.
func TestStartReportsAnEmulatorThatExits(t *testing.T) {
	starts := 0
	pickAddr = func() (string, error) { starts++; return freeAddr() }
	defer func() { pickAddr = freeAddr }()
	_, err := Start(Config{RIE: "/bin/false", Bootstrap: "/bin/true", Home: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "exited before it listened") {
		t.Fatalf("Start = %v, want an exit error", err)
	}
	if starts != 2 {
		t.Errorf("%d addresses picked, want 2 (one attempt)", starts)
	}
}

func TestQuietPortsBelowTheEphemeralRange(t *testing.T) {
	lo, hi := quietPorts()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range")
	}
	eph := strings.Fields(string(b))[0]
	if hi != 0 && (lo < 10000 || hi > mustAtoi(t, eph)) {
		t.Errorf("quiet ports [%d, %d) overlap the ephemeral range from %s", lo, hi, eph)
	}
	for range 50 {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(a)
		if n := mustAtoi(t, port); hi != 0 && (n < lo || n >= hi) {
			t.Fatalf("freeAddr gave %s, outside [%d, %d)", a, lo, hi)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
