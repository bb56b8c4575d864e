package relaycore_test

import (
	"errors"
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

var _ relaycore.BatchGetter = (*faultStore)(nil)

// The test wrapper sees a batch read as one "getmany" call that a test can
// fail as a whole; the keys reach the wrapped store's GetMany, not its Get.
func TestFaultStoreGetManyIsOneCall(t *testing.T) {
	ctx := t.Context()
	inner := mem.New(relaycore.Capabilities{})
	if err := inner.Apply(ctx, "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "a", Value: []byte("1")}}}); err != nil {
		t.Fatal(err)
	}
	f := &faultStore{Store: inner}
	var seen []call
	f.set(func(c call) error {
		seen = append(seen, c)
		if c.N == 2 {
			return errInjected
		}
		return nil
	}, nil)
	m, err := relaycore.GetMany(ctx, f, "p", []string{"a", "b"})
	if err != nil || len(m) != 1 || string(m["a"]) != "1" {
		t.Fatalf("get many = %q, %v", m, err)
	}
	if _, err := relaycore.GetMany(ctx, f, "p", []string{"a"}); !errors.Is(err, errInjected) {
		t.Fatalf("get many with an injected failure = %v", err)
	}
	if len(seen) != 2 || seen[0].Op != "getmany" || seen[0].Key != "a" || len(seen[0].Keys) != 2 {
		t.Fatalf("calls seen %+v, want two getmany calls", seen)
	}
}
