package relaycli

import (
	"bytes"
	"context"
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
