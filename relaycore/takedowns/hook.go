package takedowns

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Hook is the RelayHook the relay's handler must run for the package's
// targets (relay serve and the fire function install it; chain it with
// the application's own hook, if any). It acts only on targets under
// Namespace and adds nothing elsewhere:
//   - a holder index shard: beside each report "<content>/<node>", the
//     record "<content>/<node>/at" with the row's commit time and seq, the
//     relay's time of the report (the row is the same bytes on a replay, so
//     an idempotent retry keeps the first commit's time);
//   - a takedown partition: relaycore.TakedownRequestTimer with Delay (the
//     handoff the owner consumes, and its overdue timer);
//   - an order partition: beside each order "r/<request>", the same order
//     under "o/<seq, 20 digits>", the ascending cursor nodes page by. Seqs
//     of one source are applied in order at a target, so once a node has
//     read cursor N no order with a smaller cursor can appear later.
//
// Every write is a function of the rows alone, so a repeated delivery
// writes the same bytes.
type Hook struct {
	// Delay is how long after a request its order is overdue (the handoff's
	// timer). Zero: DefaultOverdue.
	Delay time.Duration
}

// DefaultOverdue is Hook.Delay's default: a holder online once a day
// receives and answers its order well within it.
const DefaultOverdue = 24 * time.Hour

func (h Hook) delay() time.Duration {
	if h.Delay <= 0 {
		return DefaultOverdue
	}
	return h.Delay
}

// reportAt is the value of a report's "/at" record.
type reportAt struct {
	ReportedMS int64  `json:"reported_ms"`
	Seq        uint64 `json:"seq"`
}

// BeforeApply implements relaycore.RelayHook.
func (h Hook) BeforeApply(ctx context.Context, req relaycore.HookRequest) ([]relaycore.Write, error) {
	t := string(req.Target)
	switch {
	case strings.HasPrefix(t, holdersPrefix):
		return byKey(req.Rows, func(r relaycore.Row, kv relaycore.KV) (string, []byte, error) {
			if strings.HasSuffix(kv.Key, reportAtTail) {
				return "", nil, fmt.Errorf("takedowns: a row may not write %q: the hook writes report times", kv.Key)
			}
			v, _ := json.Marshal(reportAt{ReportedMS: r.CommitMS, Seq: r.Seq})
			return kv.Key + reportAtTail, v, nil
		})
	case strings.HasPrefix(t, takedownPrefix):
		return relaycore.TakedownRequestTimer{Delay: h.delay()}.BeforeApply(ctx, req)
	case strings.HasPrefix(t, ordersPrefix):
		return byKey(req.Rows, func(r relaycore.Row, kv relaycore.KV) (string, []byte, error) {
			switch {
			case strings.HasPrefix(kv.Key, orderForPfx):
				return "", nil, nil // which takedowns the order answers: no cursor
			case !strings.HasPrefix(kv.Key, orderReqPfx):
				return "", nil, fmt.Errorf("takedowns: a row may write only %q and %q keys to an order partition, not %q", orderReqPfx, orderForPfx, kv.Key)
			}
			return fmt.Sprintf("%s%020d", orderSeqPfx, r.Seq), kv.Value, nil
		})
	}
	return nil, nil
}

// byKey derives one write from each put of rows (a later row's write for
// the same key wins, as the row's own put does), sorted by key.
func byKey(rows []relaycore.Row, derive func(relaycore.Row, relaycore.KV) (string, []byte, error)) ([]relaycore.Write, error) {
	out := map[string][]byte{}
	for _, r := range rows {
		for _, kv := range r.Puts {
			k, v, err := derive(r, kv)
			if err != nil {
				return nil, err
			}
			if k != "" {
				out[k] = v
			}
		}
	}
	ws := make([]relaycore.Write, 0, len(out))
	for k, v := range out {
		ws = append(ws, relaycore.Write{Key: k, Value: v})
	}
	slices.SortFunc(ws, func(a, b relaycore.Write) int { return strings.Compare(a.Key, b.Key) })
	return ws, nil
}
