package relayserve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

const minimal = `
listen: 127.0.0.1:7480
db: relay.db
auth:
  anonymous: {produce: ["*"], read: true}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if c.Limits != d.Limits || c.Alarms != d.Alarms || c.DrainTimeout != DefaultDrainTimeout || c.Budget.Plan != "free" {
		t.Fatalf("defaults not kept: %+v", c)
	}
	b, err := c.RelayBudget()
	free, _ := relaycore.PlanBudget("free")
	if err != nil || b != free {
		t.Fatalf("budget %+v, %v; want the free plan", b, err)
	}
}

// alarms.idle_target_ttl reaches the engine as a week by default, as
// itself when set, and as never (negative) when 0, which the engine would
// take for its default.
func TestIdleTargetTTL(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", 7 * 24 * time.Hour},
		{"alarms: {idle_target_ttl: 36h}\n", 36 * time.Hour},
		{"alarms: {idle_target_ttl: 0s}\n", -1},
	} {
		c, err := Parse([]byte(minimal + tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Alarms.idleTargetTTL(); got != tc.want {
			t.Errorf("%q: the engine gets %v, want %v", tc.yaml, got, tc.want)
		}
	}
}

// alarms.linger is off (0) by default, fractions are kept.
func TestAlarmLinger(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want float64
	}{
		{"", 0},
		{"alarms: {linger: 2}\n", 2},
		{"alarms: {linger: 0.5}\n", 0.5},
	} {
		c, err := Parse([]byte(minimal + tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if c.Alarms.Linger != tc.want {
			t.Errorf("%q: alarms.linger %v, want %v", tc.yaml, c.Alarms.Linger, tc.want)
		}
	}
}

// Each configuration is refused with a message naming the problem (and,
// for yaml's own errors, the line).
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown key", minimal + "limits:\n  max_body: 5\n", []string{`line 7: unknown key "max_body" (keys here: max_body_bytes,`}},
		{"unknown top-level key", "lisen: 127.0.0.1:1\n" + minimal, []string{`line 1: unknown key "lisen" (did you mean listen?)`}},
		{"wrong type", minimal + "drain_timeout: [1]\n", []string{"line 6"}},
		{"duration without unit", minimal + "drain_timeout: 5\n", []string{`line 6: drain_timeout: "5" is a number, want a duration with its unit, like 30s`}},
		{"mapping for a list", minimal + "principals:\n  app:\n    produce: {orders: 1}\n", []string{`line 8: a mapping where the key wants a list, like [orders, invoices]`}},
		{"produce not a list", minimal + "principals:\n  app: {produce: orders}\n", []string{`line 7: principals.app.produce: "orders" is a string, want a list, like [orders, invoices]`}},
		{"no db", "listen: 127.0.0.1:1\nauth: {anonymous: {read: true}}\n", []string{"db is required"}},
		{"unknown plan", minimal + "budget: {plan: gold}\n", []string{`budget.plan "gold"`}},
		{"plan with fields", minimal + "budget: {plan: paid, rows_per_fire: 10}\n", []string{"use plan custom"}},
		{"custom budget missing fields", minimal + "budget: {plan: custom, fires_per_alarm: 2}\n",
			[]string{"budget.targets_per_fire 0", "budget.calls_per_target 0", "budget.rows_per_fire 0"}},
		{"custom budget out of range", minimal + "budget: {plan: custom, fires_per_alarm: 1000, targets_per_fire: 8, calls_per_target: 2, rows_per_fire: 100}\n",
			[]string{"budget.fires_per_alarm 1000: want 1..64"}},
		{"anonymous on all interfaces", "listen: :7480\ndb: x\ntls: {cert: c, key: k}\nauth: {anonymous: {read: true}}\n",
			[]string{"auth.anonymous is allowed only when listen is a loopback address"}},
		{"anonymous on a LAN address", "listen: 192.168.1.10:7480\ndb: x\ntls: {cert: c, key: k}\nauth: {anonymous: {read: true}}\n",
			[]string{"auth.anonymous is allowed only when listen is a loopback address"}},
		{"plain HTTP beyond loopback", "listen: 0.0.0.0:7480\ndb: x\nauth: {tokens_file: t}\n", []string{"tls.cert and tls.key are required"}},
		{"no authentication", "listen: 127.0.0.1:1\ndb: x\n", []string{"no way to authenticate"}},
		{"client CA without TLS", minimal + "tls: {client_ca: ca.crt}\n", []string{"tls.client_ca needs tls.cert"}},
		{"half a key pair", minimal + "tls: {cert: c}\n", []string{"tls.cert and tls.key go together"}},
		{"bad source in produce", minimal + "principals: {app: {produce: [\"\"]}}\n", []string{"principals.app.produce[0]: source is missing"}},
		{"bad principal name", minimal + "principals: {\"a b\": {read: true}}\n", []string{`name "a b"`}},
		{"anonymous principal", minimal + "principals: {anonymous: {read: true}}\n", []string{"anonymous is reserved"}},
		{"bad limits", minimal + "limits: {max_body_bytes: 10, read_timeout: -1s}\n", []string{"limits.max_body_bytes 10", "limits.read_timeout -1s"}},
		{"claim ttl too short", minimal + "alarms: {claim_ttl: 100ms}\n", []string{"alarms.claim_ttl 100ms: want 1s..5m"}},
		{"idle target ttl too short", minimal + "alarms: {idle_target_ttl: 30m}\n", []string{"alarms.idle_target_ttl 30m0s: want 0s (never) or 1h..87600h"}},
		{"linger negative", minimal + "alarms: {linger: -1}\n", []string{"alarms.linger -1: want 0 (fire a busy source again at once) to 10"}},
		{"linger too long", minimal + "alarms: {linger: 11}\n", []string{"alarms.linger 11: want 0"}},
		{"linger not a number", minimal + "alarms: {linger: .nan}\n", []string{"alarms.linger NaN: want 0"}},
		{"replica name with a space", minimal + "alarms: {replica: \"node a\"}\n", []string{`alarms.replica "node a": want at most 128 bytes`}},
		{"replica name too long", minimal + "alarms: {replica: " + strings.Repeat("r", 129) + "}\n", []string{"alarms.replica", "at most 128 bytes"}},
		{"bad log level", minimal + "log_level: loud\n", []string{`log_level "loud"`}},
		{"same targets file", minimal + "targets: {db: relay.db}\n", []string{"targets.db is the same file"}},
		{"port out of range", "listen: localhost:99999\ndb: x\nauth: {tokens_file: t}\n", []string{`line 1: listen "localhost:99999": port "99999": want a number from 0 to 65535`}},
		{"negative port", "listen: 127.0.0.1:-5\ndb: x\nauth: {tokens_file: t}\n", []string{`listen "127.0.0.1:-5": port "-5"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// Every problem is reported at once: an unknown key does not hide the
// rule violations of the rest.
func TestParseReportsAll(t *testing.T) {
	_, err := Parse([]byte("listen: :1\nbogus: 1\nbudget: {plan: gold}\nauth: {anonymous: {read: true}}\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{`unknown key "bogus"`, "db is required", `budget.plan "gold"`, "auth.anonymous is allowed only", "tls.cert and tls.key are required"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// A repeated key is reported alone: yaml.v3 decodes nothing of the
// mapping that holds it, so the rules would call its other keys missing.
func TestParseDuplicateKey(t *testing.T) {
	_, err := Parse([]byte("db: relay.db\nauth:\n  tokens_file: t\nauth:\n  tokens_file: u\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	if !strings.Contains(err.Error(), `line 4: mapping key "auth" already defined at line 2`) {
		t.Errorf("error lacks the repeated key:\n%v", err)
	}
	for _, bogus := range []string{"db is required", "no way to authenticate"} {
		if strings.Contains(err.Error(), bogus) {
			t.Errorf("error has %q, which the file sets:\n%v", bogus, err)
		}
	}
}

func TestLoadResolvesPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(path, []byte(minimal+"targets: {db: /abs/targets.db}\ndrain_timeout: 5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.DB != filepath.Join(dir, "relay.db") || c.Targets.DB != "/abs/targets.db" || c.DrainTimeout != 5*time.Second {
		t.Fatalf("paths not resolved: db %q, targets %q, drain %v", c.DB, c.Targets.DB, c.DrainTimeout)
	}
}

func TestTokensFile(t *testing.T) {
	tok, line, err := MintToken("app")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, TokenPrefix) || line != "app "+HashToken(tok) {
		t.Fatalf("token %q line %q", tok, line)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("# comment\n\n"+line+"\n"), 0o600)
	app := map[string]Roles{"app": {Read: true}}
	byHash, err := loadTokens(good, app)
	if err != nil || len(byHash) != 1 {
		t.Fatalf("good file: %v, %d tokens", err, len(byHash))
	}
	bad := filepath.Join(dir, "bad")
	_, other, _ := MintToken("ghost")
	os.WriteFile(bad, []byte(line+"\n"+line+"\napp md5:abc\nlonely\napp sha256:zz\n"+other+"\n"), 0o600)
	_, err = loadTokens(bad, app)
	for _, w := range []string{"bad:2: the same token digest", "bad:3: digest must be", "bad:4: want", "bad:5: digest must be",
		`bad:6: principal "ghost" is not under principals in the configuration: add it there`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
	if _, _, err := MintToken("has space"); err == nil {
		t.Error("minted a token for an invalid principal name")
	}
}

// A rule broken by a key of the file names the key's line (or, when the
// key is missing, its section's), and every problem is a line of its own.
func TestProblemsHaveLines(t *testing.T) {
	_, err := Parse([]byte(`listen: 127.0.0.1:7480
db: relay.db
auth:
  anonymous: {read: true}
budget:
  plan: custom
  fires_per_alarm: 2
limits:
  max_body_bytes: 10
log_level: loud
principals:
  "a b": {read: true}
`))
	var probs Problems
	if !errors.As(err, &probs) || !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v (%T) is not Problems wrapping ErrConfig", err, err)
	}
	msg := err.Error()
	for _, w := range []string{
		"\n  line 5: budget.targets_per_fire 0: want 1..256", // absent: its section's line
		"\n  line 9: limits.max_body_bytes 10",
		"\n  line 10: log_level \"loud\"",
		"\n  line 12: principals: name \"a b\"",
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q:\n%s", w, msg)
		}
	}
	if !strings.HasPrefix(msg, ErrConfig.Error()+": 6 problems\n") {
		t.Errorf("header: %s", msg)
	}
}

// LoadAndCheck reports the files the configuration names along with the
// document's own problems, in one run.
func TestLoadAndCheckReportsFilesWithRules(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.yaml")
	os.WriteFile(path, []byte("db: relay.db\ntargets: {db: nodir/targets.db}\nbugdet: {plan: paid}\ntls: {cert: missing.crt, key: missing.key}\nauth: {tokens_file: missing-tokens}\n"), 0o600)
	_, err := LoadAndCheck(path)
	for _, w := range []string{`line 3: unknown key "bugdet" (did you mean budget?)`, "missing.crt", "missing-tokens",
		"targets.db " + filepath.Join(dir, "nodir/targets.db") + ": its directory:"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}
