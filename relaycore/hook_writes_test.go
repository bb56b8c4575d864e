package relaycore_test

import (
	"context"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// badHook adds one write the engine must refuse.
type badHook struct{ w relaycore.Write }

func (h badHook) BeforeApply(context.Context, relaycore.HookRequest) ([]relaycore.Write, error) {
	return []relaycore.Write{h.w}, nil
}

// Hook writes may not touch reserved keys (rh among them) or the rows' own
// keys: such a hook blocks its target, and nothing reaches the target.
func TestHookWritesToForbiddenKeysBlockTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    relaycore.Write
	}{
		{"rh", relaycore.Write{Key: relaycore.RHKey("src-a"), Value: []byte("999")}},
		{"reserved", relaycore.Write{Key: relaycore.ReservedPrefix + "x", Value: []byte("1")}},
		{"a row's key", relaycore.Write{Key: "k", Value: []byte("hook")}},
		{"empty key", relaycore.Write{Value: []byte("1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.Hook = badHook{tc.w}
			e.enqueue(put("t", "k", "row"))
			res, err := e.h.Fire(e.ctx, e.source)
			if err != nil || res.TargetsBlocked != 1 || res.TargetCalls != 0 {
				t.Fatalf("fire: %+v, %v; want the target blocked before any apply", res, err)
			}
			if d := e.tgt.Dump(); len(d) != 0 {
				t.Fatalf("the target was written: %v", d)
			}
		})
	}
}
