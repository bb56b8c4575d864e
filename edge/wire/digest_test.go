package wire

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestDigestRewinds(t *testing.T) {
	r := strings.NewReader("hello")
	size, sum, err := Digest(r)
	if err != nil || size != 5 || sum != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("Digest = %d, %s, %v", size, sum, err)
	}
	rest, _ := io.ReadAll(r)
	if !bytes.Equal(rest, []byte("hello")) {
		t.Fatalf("not rewound: read %q after Digest", rest)
	}
}
