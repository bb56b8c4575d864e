package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "edgectl ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("exit %d: %q %q", code, out.String(), errb.String())
	}
}
