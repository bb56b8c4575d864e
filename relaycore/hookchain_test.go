package relaycore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

type fixedHook struct {
	writes []relaycore.Write
	err    error
	seen   *relaycore.HookRequest
}

func (f fixedHook) BeforeApply(_ context.Context, req relaycore.HookRequest) ([]relaycore.Write, error) {
	if f.seen != nil {
		*f.seen = req
	}
	return f.writes, f.err
}

func TestChainHooks(t *testing.T) {
	ctx := context.Background()
	req := relaycore.HookRequest{Source: "s", Target: "t", RoomItems: 10, RoomBytes: 1000}
	var second relaycore.HookRequest
	chain := relaycore.ChainHooks(
		fixedHook{writes: []relaycore.Write{{Key: "a", Value: []byte("12345")}}},
		relaycore.NoHook{},
		fixedHook{writes: []relaycore.Write{{Key: "b"}}, seen: &second},
	)
	ws, err := chain.BeforeApply(ctx, req)
	if err != nil || len(ws) != 2 || ws[0].Key != "a" || ws[1].Key != "b" {
		t.Fatalf("writes %v, err %v", ws, err)
	}
	if second.RoomItems != 9 || second.RoomBytes != 994 {
		t.Fatalf("third hook saw room %d items / %d bytes, want 9 / 994", second.RoomItems, second.RoomBytes)
	}

	boom := errors.New("boom")
	if _, err := relaycore.ChainHooks(relaycore.NoHook{}, fixedHook{err: boom}).BeforeApply(ctx, req); !errors.Is(err, boom) {
		t.Fatalf("error not propagated: %v", err)
	}
	dup := relaycore.ChainHooks(fixedHook{writes: []relaycore.Write{{Key: "k"}}}, fixedHook{writes: []relaycore.Write{{Key: "k"}}})
	if _, err := dup.BeforeApply(ctx, req); err == nil || !strings.Contains(err.Error(), "both write key") {
		t.Fatalf("duplicate key across hooks: %v", err)
	}
}
