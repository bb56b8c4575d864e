package relaycore

import (
	"context"
	"fmt"
	"sort"
)

// HookRequest describes one target apply attempt to a RelayHook.
type HookRequest struct {
	Source, Target Partition
	// Rows are the rows this attempt applies, ascending seq (Seq, CommitMS
	// and Target set). They are newer than the target's rh as the fire
	// knew it when the attempt was planned: read, or carried from the
	// checkpoint that last recorded it, which a crash after an apply leaves
	// behind (the batch is then refused and the rows offered again, trimmed
	// to what rh as read leaves).
	Rows []Row
	// Attempt counts apply attempts for this target in this fire, from 1;
	// a shrunk group is asked again with the same Attempt.
	Attempt int
	// RoomItems and RoomBytes are what the batch has left for hook writes
	// before the engine would have to shrink the group.
	RoomItems, RoomBytes int
}

// RelayHook runs before each target apply attempt, including retries on
// contention and after shrinking a group to fit the hook's additions. Its
// writes join the target batch atomically with the rows and the rh advance.
// Added writes must fit the batch limits, must not touch the rows' keys or
// keys under ReservedPrefix, and must tolerate repeated delivery (the same
// rows may be offered again after a crash). An error leaves this target's
// rows queued (the target joins the cycle's blocked set) and does not stop
// other targets.
type RelayHook interface {
	BeforeApply(ctx context.Context, req HookRequest) ([]Write, error)
}

// noHook is the hook of a handler without one: it adds nothing.
type noHook struct{}

// BeforeApply implements RelayHook.
func (noHook) BeforeApply(context.Context, HookRequest) ([]Write, error) { return nil, nil }

// HolderRelayHook adds, to every apply at a target, records derived from
// observations supplied when the hook was built: it has no store or client,
// so it cannot read anything at apply time and its effects depend only on
// what the caller observed. Each observation for the target is upserted as
// key Prefix+Key with its value; upserting identical values makes repeated
// delivery harmless.
type HolderRelayHook struct {
	// Prefix namespaces the hook's keys (e.g. "holder/"). Required.
	Prefix string
	// Observations maps a target to the records to maintain there.
	Observations map[Partition][]KV
}

// BeforeApply implements RelayHook.
func (h HolderRelayHook) BeforeApply(_ context.Context, req HookRequest) ([]Write, error) {
	obs := h.Observations[req.Target]
	if len(obs) == 0 {
		return nil, nil
	}
	if h.Prefix == "" {
		return nil, fmt.Errorf("holder hook: empty prefix")
	}
	out := make([]Write, 0, len(obs))
	for _, kv := range obs {
		out = append(out, Write{Key: h.Prefix + kv.Key, Value: kv.Value})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ChainHooks runs several hooks as one: for each apply attempt each hook
// runs in order, sees the room the earlier hooks left, and the writes are
// concatenated. The first error stops the chain and is returned (the
// target's rows stay queued, as for any hook error). Two hooks writing the
// same key is an error, because a target batch cannot touch a key twice.
func ChainHooks(hooks ...RelayHook) RelayHook { return hookChain(hooks) }

type hookChain []RelayHook

// BeforeApply implements RelayHook.
func (c hookChain) BeforeApply(ctx context.Context, req HookRequest) ([]Write, error) {
	var out []Write
	seen := map[string]int{}
	for i, h := range c {
		ws, err := h.BeforeApply(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("hook %d: %w", i, err)
		}
		for _, w := range ws {
			if j, dup := seen[w.Key]; dup {
				return nil, fmt.Errorf("hooks %d and %d both write key %q", j, i, w.Key)
			}
			seen[w.Key] = i
			req.RoomItems--
			req.RoomBytes -= len(w.Key) + len(w.Value)
		}
		out = append(out, ws...)
	}
	return out, nil
}
