package relaycore

import (
	"context"
	"fmt"
	"strings"
)

// Reading target partitions. A target partition holds the application's
// keys, written by relay rows, beside the engine's own keys under
// ReservedPrefix (one rh watermark per source that ever delivered there).
// ReadTarget pages through the application's keys only; TargetWatermarks
// lists the rh of every source. An application that needs to know its
// data includes a row it enqueued (seq N from source S) reads S's
// watermark: once it is >= N, every key the row wrote is in the partition
// (or was overwritten by a later row of S).
//
// Neither is a snapshot of the whole partition: each store page is read
// consistently, but delivery may write between pages, as it may between a
// watermark read and an item read. Read the watermark first: the items
// read afterwards include at least everything it promises.

// DefaultTargetReadLimit is ReadTarget's page size when Limit <= 0.
const DefaultTargetReadLimit = 100

// TargetReadRequest selects one page of a target partition's application
// keys, in ascending key order.
type TargetReadRequest struct {
	// Prefix keeps only keys starting with it ("": every key).
	Prefix string
	// After resumes strictly after this key: TargetPage.Next of the
	// previous page ("": from the start).
	After string
	// Limit bounds the items of the page (<= 0: DefaultTargetReadLimit).
	Limit int
	// MaxBytes bounds the sum of the page's key and value lengths (<= 0:
	// no bound). A page always holds at least one item when one remains,
	// so a single value larger than MaxBytes is still readable.
	MaxBytes int
}

// TargetPage is one page of ReadTarget. Next is empty on the last page;
// otherwise pass it as After for the next one (which may turn out empty).
type TargetPage struct {
	Items []KV
	Next  string
}

// SourceWatermark is one source's rh at a target: every row of Source
// with seq <= Through has been applied there.
type SourceWatermark struct {
	Source  Partition `json:"source"`
	Through uint64    `json:"delivered_through"`
}

// ReadTarget reads one page of target's application keys and values
// (engine keys under ReservedPrefix are left out). An unknown or empty
// partition reads as an empty last page. Values are copies the caller
// owns.
func ReadTarget(ctx context.Context, st Store, target Partition, req TargetReadRequest) (TargetPage, error) {
	if err := validTarget(target); err != nil {
		return TargetPage{}, fmt.Errorf("read target: %w", err)
	}
	limit := req.Limit
	if limit <= 0 {
		limit = DefaultTargetReadLimit
	}
	scan := ScanRequest{Start: req.Prefix, End: keyPrefixEnd(req.Prefix), After: req.After, Limit: limit + 1}
	var (
		out  TargetPage
		size int
	)
	for {
		pg, err := st.Scan(ctx, target, scan)
		if err != nil {
			return TargetPage{}, fmt.Errorf("read target %s: %w", target, err)
		}
		for _, it := range pg.Items {
			if strings.HasPrefix(it.Key, ReservedPrefix) {
				continue
			}
			full := len(out.Items) >= limit || (req.MaxBytes > 0 && len(out.Items) > 0 && size+len(it.Key)+len(it.Value) > req.MaxBytes)
			if full {
				// Another application key follows: the page is not the last.
				out.Next = out.Items[len(out.Items)-1].Key
				return out, nil
			}
			size += len(it.Key) + len(it.Value)
			out.Items = append(out.Items, KV(it))
		}
		if pg.Next == "" {
			return out, nil
		}
		scan.After = pg.Next
	}
}

// TargetWatermarks lists the rh of every source that delivered to target,
// in source order (none: an empty slice).
func TargetWatermarks(ctx context.Context, st Store, target Partition) ([]SourceWatermark, error) {
	if err := validTarget(target); err != nil {
		return nil, fmt.Errorf("target watermarks: %w", err)
	}
	out := []SourceWatermark{}
	scan := ScanRequest{Start: rhPrefix, End: prefixEnd(rhPrefix)}
	for {
		pg, err := st.Scan(ctx, target, scan)
		if err != nil {
			return nil, fmt.Errorf("target watermarks %s: %w", target, err)
		}
		for _, it := range pg.Items {
			rh, err := decodeRH(it.Value, true)
			if err != nil {
				return nil, fmt.Errorf("target watermarks %s: %w", target, err)
			}
			out = append(out, SourceWatermark{Source: Partition(strings.TrimPrefix(it.Key, rhPrefix)), Through: rh})
		}
		if pg.Next == "" {
			return out, nil
		}
		scan.After = pg.Next
	}
}

func validTarget(t Partition) error {
	if t == "" || len(t) > MaxPartitionLen {
		return fmt.Errorf("target name must be 1..%d bytes", MaxPartitionLen)
	}
	return nil
}

// keyPrefixEnd is the first key after every key starting with prefix (""
// for no bound: an empty prefix, or one of 0xff bytes only).
func keyPrefixEnd(prefix string) string {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}
