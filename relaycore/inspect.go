package relaycore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// SourceInspector reads a source partition like InspectSource, and keeps
// what it decoded of each item (pages, held pages, target records, os, rs,
// the alarm, the lease, q) to reuse while the item's stored bytes stay the
// same. The simulation inspects a source after every store call that may
// have changed it, and most of its items did not change: decoding them
// again (inflating pages, parsing JSON) was most of its checker's time.
// A view is the same as InspectSource's for the same stored bytes, since
// decoding depends on nothing else.
//
// The zero value is ready; a nil *SourceInspector decodes everything (that
// is InspectSource). An inspector keeps one source's items (inspecting
// another source starts over). Views share decoded rows and records with
// each other: callers must not modify them. Not safe for concurrent use.
type SourceInspector struct {
	source Partition
	gen    uint64
	items  map[string]inspected
}

type inspected struct {
	raw []byte
	val any
	gen uint64 // the last Inspect that saw the item
}

func (in *SourceInspector) begin(source Partition) {
	if in == nil {
		return
	}
	if in.items == nil || in.source != source {
		in.source, in.items = source, map[string]inspected{}
	}
	in.gen++
}

// end forgets the items the last Inspect did not see (deleted).
func (in *SourceInspector) end() {
	if in == nil {
		return
	}
	for k, e := range in.items {
		if e.gen != in.gen {
			delete(in.items, k)
		}
	}
}

// memo decodes it.Value with dec, or returns what dec returned for the same
// key and bytes before. Errors are not kept.
func memo[T any](in *SourceInspector, it Item, dec func([]byte) (T, error)) (T, error) {
	if in == nil {
		return dec(it.Value)
	}
	if e, ok := in.items[it.Key]; ok && bytes.Equal(e.raw, it.Value) {
		e.gen = in.gen
		in.items[it.Key] = e
		return e.val.(T), nil
	}
	v, err := dec(it.Value)
	if err != nil {
		delete(in.items, it.Key)
		return v, err
	}
	in.items[it.Key] = inspected{raw: bytes.Clone(it.Value), val: v, gen: in.gen}
	return v, nil
}

func decodeLeaseValue(raw []byte) (Lease, error) {
	l, _, err := decodeLease(raw)
	if err != nil {
		return Lease{}, err
	}
	return *l, nil
}

func (in *SourceInspector) Inspect(ctx context.Context, st Store, source Partition) (SourceView, error) {
	in.begin(source)
	var v SourceView
	var recs, dead []Item
	after := ""
	for {
		pg, err := st.Scan(ctx, source, ScanRequest{After: after})
		if err != nil {
			return v, fmt.Errorf("inspect %s: %w", source, err)
		}
		for _, it := range pg.Items {
			switch {
			case it.Key == KeyOS:
				if v.OS, err = memo(in, it, func(b []byte) (OutboxState, error) { return decodeOS(b, true) }); err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.OSFound = true
			case it.Key == KeyRS:
				rs, err := memo(in, it, decodeRS)
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.RS = &rs
			case it.Key == KeyAlarm:
				a, err := memo(in, it, decodeAlarm)
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Alarm = &a
			case it.Key == layout.KeyLease:
				l, err := memo(in, it, decodeLeaseValue)
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Lease = &l
			case strings.HasPrefix(it.Key, layout.PagePrefix):
				p, err := memo(in, it, func(b []byte) (Page, error) { return decodePage(it.Key, b) })
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Pages = append(v.Pages, p)
			case it.Key == layout.KeyHold:
				h, err := memo(in, it, func(b []byte) (holdSummary, error) { return decodeHold(b, true) })
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Hold = HoldSummary(h)
			case strings.HasPrefix(it.Key, layout.TargetPrefix):
				recs = append(recs, it)
			case strings.HasPrefix(it.Key, layout.HeldPrefix):
				p, err := memo(in, it, func(b []byte) (Page, error) { return decodePage(it.Key, b) })
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Held = append(v.Held, p)
			case strings.HasPrefix(it.Key, layout.RetryPrefix):
				due, t, err := parseRetryKey(it.Key)
				if err != nil {
					return v, fmt.Errorf("inspect %s: %w", source, err)
				}
				v.Retries = append(v.Retries, RetryMarker{DueMS: due, Target: t})
			case strings.HasPrefix(it.Key, layout.DeadPrefix):
				dead = append(dead, it)
			case strings.HasPrefix(it.Key, IdemPrefix):
				v.Idempotency = append(v.Idempotency, it.Key)
			default:
				v.Other = append(v.Other, it.Key)
			}
		}
		if pg.Next == "" {
			break
		}
		after = pg.Next
	}
	if !v.OSFound {
		v.OS = emptyOS()
	}
	if v.RS != nil {
		// Ghosts (gone.go): taken out, not yet deleted.
		v.Pages = slices.DeleteFunc(v.Pages, func(p Page) bool { return isGone(v.RS.Gone, p.Key) })
		v.Held = slices.DeleteFunc(v.Held, func(p Page) bool { return isHeldGone(v.RS.GoneHeld, p.Key) })
	}
	var err error
	fs := folds{os: v.OS}
	if v.RS != nil {
		fs.rs = *v.RS
	}
	if v.Targets, err = in.targetStatuses(mergeItems(recs, foldItems(fs, "")), fs); err != nil {
		return v, fmt.Errorf("inspect %s: %w", source, err)
	}
	if v.Archive, err = archiveEntries(dead); err != nil {
		return v, fmt.Errorf("inspect %s: %w", source, err)
	}
	in.end()
	return v, nil
}
