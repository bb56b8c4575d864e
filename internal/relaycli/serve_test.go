package relaycli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/relay-dev/relay/internal/relayserve"
)

// `relay serve token` prints a token and the tokens-file line holding its
// digest, and refuses a missing or invalid principal.
func TestServeToken(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"serve", "token", "--principal", "orders-app"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var token, line string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if v, ok := strings.CutPrefix(l, "token: "); ok {
			token = v
		}
		if v, ok := strings.CutPrefix(l, "tokens_file line: "); ok {
			line = v
		}
	}
	if !strings.HasPrefix(token, relayserve.TokenPrefix) || line != "orders-app "+relayserve.HashToken(token) {
		t.Fatalf("output %q", out.String())
	}
	for _, args := range [][]string{{"serve", "token"}, {"serve", "token", "--principal", "has space"}, {"serve"}} {
		errb.Reset()
		if code := Run(context.Background(), args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
}

// `relay serve token --json` prints the principal, the token and its
// tokens-file line as one JSON object; a refusal is a JSON error object.
func TestServeTokenJSON(t *testing.T) {
	out, _ := cli(t, 0, "", "serve", "token", "--principal", "orders-app", "--json")
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got) != 3 || got["principal"] != "orders-app" || !strings.HasPrefix(got["token"], relayserve.TokenPrefix) ||
		got["tokens_file_line"] != "orders-app "+relayserve.HashToken(got["token"]) {
		t.Fatalf("token --json: %s", out)
	}
	out, _ = cli(t, 1, "", "serve", "token", "--json")
	if e := jsonError(t, out); e.Code != codeUsage {
		t.Fatalf("token --json without --principal: %+v", e)
	}
	out, _ = cli(t, 1, "", "serve", "token", "--principal", "has space", "--json")
	if e := jsonError(t, out); e.Code != codeUsage || !strings.Contains(e.Message, "has space") {
		t.Fatalf("token --json with a bad principal: %+v", e)
	}
}
