package relayserve_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/relay-dev/relay/internal/relayserve"
)

// SIGHUP applies the roles of the re-read configuration file to new
// requests, on the connections already open too: a role granted works
// at once, a role revoked is refused at once, and a principal removed
// from principals (a certificate's, or a token's together with its
// tokens-file line) is shut out. A file that changes a key read only at
// start is refused whole, naming the key, and so is a file that fails
// validation; the roles in use stay either way.
func TestReloadRoles(t *testing.T) {
	f := newFixture(t, "")
	p := f.start(t)
	c := f.client(t, p, "")
	cert := f.client(t, p, "certproducer")
	src := p.URL + "/v1/sources/orders"
	type check struct {
		name   string
		client *http.Client
		token  string
		method string
		path   string
		status int
	}
	expect := func(t *testing.T, checks ...check) {
		t.Helper()
		for _, ch := range checks {
			var body []byte
			if ch.method == "POST" {
				body = rowsBody("t", "k", "v")
			}
			if r := do(t, ch.client, ch.method, src+ch.path, ch.token, body); r.status != ch.status {
				t.Errorf("%s: %d %s; want %d", ch.name, r.status, r.body, ch.status)
			}
		}
	}
	producerReads := check{"producer reads", c, f.tokens["producer"], "GET", "/state", 403}
	readerReads := check{"reader reads", c, f.tokens["reader"], "GET", "/state", 200}
	certProduces := check{"certificate produces", cert, "", "POST", "/rows", 200}
	operatorLists := check{"operator lists targets", c, f.tokens["operator"], "GET", "/targets", 200}
	expect(t, producerReads, readerReads, certProduces, operatorLists)

	// Grant producer read, revoke reader's, remove certproducer.
	granted := `
principals:
  producer: {produce: [orders, "tenant/42"], read: true}
  reader: {read: false}
  operator: {read: true, operate: true}
  roleless: {}
`
	f.rewrite(t, f.base+granted)
	p.Signal(t, syscall.SIGHUP)
	line := p.WaitLog(t, "relay serve: reloaded")
	if !strings.Contains(line, `"changed":["principals.certproducer","principals.producer.read","principals.reader.read"]`) {
		t.Errorf("reloaded log does not list the changed keys: %s", line)
	}
	producerReads.status, readerReads.status, certProduces.status = 200, 403, 403
	expect(t, producerReads, readerReads, certProduces, operatorLists)

	// A key read only at start changes along with a role: the whole file
	// is refused, and the log names every such key by its path.
	restart := strings.Replace(f.base, "max_body_bytes: 65536", "max_body_bytes: 65537", 1)
	restart = strings.Replace(restart, "listen: 127.0.0.1:0", "listen: 127.0.0.1:7999", 1)
	if restart == f.base {
		t.Fatal("the fixture's configuration changed: the test's replacements no longer apply")
	}
	f.rewrite(t, restart+strings.Replace(granted, "reader: {read: false}", "reader: {read: true}", 1))
	p.Signal(t, syscall.SIGHUP)
	line = p.WaitLogN(t, reloadFailed, 1)
	for _, w := range []string{`"restart_keys":["limits.max_body_bytes","listen"]`, "limits.max_body_bytes, listen changed", "restart"} {
		if !strings.Contains(line, w) {
			t.Errorf("refusal log lacks %q: %s", w, line)
		}
	}
	expect(t, producerReads, readerReads, certProduces, operatorLists)

	// A file that fails validation (every problem is logged): a principal
	// removed while the tokens file still names it, and a misspelt key.
	broken := strings.Replace(granted, "  roleless: {}\n", "", 1) + "bugdet: {plan: paid}\n"
	f.rewrite(t, f.base+broken)
	p.Signal(t, syscall.SIGHUP)
	line = p.WaitLogN(t, reloadFailed, 2)
	for _, w := range []string{"2 problems", `unknown key \"bugdet\"`, `principal \"roleless\" is not under principals`} {
		if !strings.Contains(line, w) {
			t.Errorf("refusal log lacks %q: %s", w, line)
		}
	}
	if strings.Contains(line, "restart_keys") {
		t.Errorf("an invalid file is reported as needing a restart: %s", line)
	}
	expect(t, producerReads, readerReads, certProduces, operatorLists)

	// Revoking a token's principal: out of principals and out of the
	// tokens file, then its token is refused.
	var lines []string
	for _, name := range []string{"producer", "reader", "roleless"} {
		lines = append(lines, name+" "+relayserve.HashToken(f.tokens[name]))
	}
	if err := os.WriteFile(filepath.Join(f.dir, "tokens"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.rewrite(t, f.base+strings.Replace(granted, "  operator: {read: true, operate: true}\n", "", 1))
	p.Signal(t, syscall.SIGHUP)
	line = p.WaitLogN(t, "relay serve: reloaded", 2)
	if !strings.Contains(line, `"changed":["principals.operator"]`) {
		t.Errorf("reloaded log does not list the removed principal: %s", line)
	}
	operatorLists.status = 401
	expect(t, producerReads, readerReads, certProduces, operatorLists)

	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
