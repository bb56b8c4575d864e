package event

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/lambda"
)

type sample struct {
	Source string `json:"source"`
}

func TestDecodeStrict(t *testing.T) {
	for _, tc := range []struct {
		name, payload, reason string // reason "" means accepted
	}{
		{"valid", `{"source":"orders"}`, ""},
		{"valid with space", " \n{\"source\":\"orders\"}\n", ""},
		{"unknown field", `{"sourc":"orders"}`, `unknown field "sourc"`},
		// encoding/json alone takes these, firing another source than named.
		{"field name in another case", `{"Source":"orders"}`, `unknown field "Source" (field names are case-sensitive`},
		{"repeated field", `{"source":"orders","source":"other"}`, `field "source" appears twice`},
		{"half a surrogate pair", `{"source":"\ud800"}`, "surrogate pair"},
		{"extra field", `{"source":"a","note":"x"}`, `unknown field "note"`},
		{"wrong type", `{"source":42}`, `field "source" must be a JSON string`},
		{"null", `null`, "not a JSON object"},
		{"array", `[{"source":"a"}]`, "not a JSON object"},
		{"string", `"orders"`, "not a JSON object"},
		{"empty", ``, "not a JSON object"},
		{"trailing object", `{"source":"a"}{"source":"b"}`, "trailing data"},
		{"trailing garbage", `{"source":"a"} x`, "trailing data"},
		{"truncated", `{"source":"a"`, "unexpected EOF"},
		{"oversized", `{"source":"` + strings.Repeat("a", MaxPayloadBytes) + `"}`, "limit 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v sample
			err := DecodeStrict("fire", []byte(tc.payload), &v)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ie *InvalidEventError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("err = %v, want an *InvalidEventError", err)
			}
			if ie.Function != "fire" || !strings.Contains(ie.Reason, tc.reason) {
				t.Errorf("err = %q, want function fire and a reason containing %q", err, tc.reason)
			}
		})
	}
}

func TestSource(t *testing.T) {
	for _, tc := range []struct {
		name, in, reason string
	}{
		{"plain", "orders", ""},
		{"slashes and unicode", "tenant/42/Zürich", ""},
		{"longest", strings.Repeat("s", 255), ""},
		{"empty", "", "missing or empty"},
		{"too long", strings.Repeat("s", 256), "256 bytes, limit 255"},
		{"invalid utf8", "a\xffb", "not valid UTF-8"},
		{"control", "a\nb", "control character"},
		{"reserved", "_relay/rh/x", "reserved prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Source("source", tc.in)
			if tc.reason == "" {
				if err != nil || string(p) != tc.in {
					t.Fatalf("Source(%q) = %q, %v", tc.in, p, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.reason) || !strings.HasPrefix(err.Error(), "source ") {
				t.Errorf("Source(%q) err = %v, want %q", tc.in, err, tc.reason)
			}
		})
	}
}

// TestInvokerEncodesAsTheRuntime: a result through Invoker is the bytes
// aws-lambda-go's own handler would send for it, and a payload the
// runtime could not decode (empty, not JSON) reaches the handler as sent.
func TestInvokerEncodesAsTheRuntime(t *testing.T) {
	type result struct {
		Source string `json:"source"`
		N      int    `json:"n,omitempty"`
	}
	handle := func(_ context.Context, payload json.RawMessage) (result, error) {
		if len(bytes.TrimSpace(payload)) == 0 {
			return result{}, &InvalidEventError{"test", "payload is not a JSON object"}
		}
		return result{Source: "a<b>&c", N: len(payload)}, nil
	}
	payload := []byte(`{"source":"x"}`)
	want, err := lambda.NewHandler(handle).Invoke(context.Background(), payload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Invoker(handle).Invoke(context.Background(), payload)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("Invoker: %q, %v; the runtime's handler: %q", got, err, want)
	}
	for _, p := range [][]byte{nil, []byte("not json")} {
		_, err := Invoker(handle).Invoke(context.Background(), p)
		if p == nil && !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("empty payload: %v, want the handler's InvalidEventError", err)
		}
		if p != nil && err != nil {
			t.Errorf("payload %q: %v, want it passed to the handler", p, err)
		}
	}
}
