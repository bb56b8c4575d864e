package relaycore_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// TestReadTarget: after delivery from two sources, ReadTarget pages
// through the application's keys only (never the rh records), honours
// Prefix, Limit and MaxBytes, resumes from Next without gaps or repeats,
// and TargetWatermarks names each source's last applied seq.
func TestReadTarget(t *testing.T) {
	e := newEnv(t, "paid")
	var want []string
	for i := range 25 {
		k := fmt.Sprintf("k/%02d", i)
		want = append(want, k)
		e.enqueue(put("t", k, "v"+k))
	}
	e.enqueueFrom("src-b", put("t", "z", "from b"), del("t", "k/00"))
	want = want[1:]
	want = append(want, "z")
	e.drain(e.source, 20)
	e.drain("src-b", 20)

	read := func(req relaycore.TargetReadRequest) []string {
		t.Helper()
		var got []string
		for pages := 0; ; pages++ {
			pg, err := relaycore.ReadTarget(e.ctx, e.tgt, "t", req)
			if err != nil {
				t.Fatal(err)
			}
			if req.Limit > 0 && len(pg.Items) > req.Limit {
				t.Fatalf("page of %d items, limit %d", len(pg.Items), req.Limit)
			}
			for _, kv := range pg.Items {
				if string(kv.Value) != "v"+kv.Key && kv.Key != "z" {
					t.Errorf("%s = %q", kv.Key, kv.Value)
				}
				got = append(got, kv.Key)
			}
			if pg.Next == "" {
				return got
			}
			if pages > 100 {
				t.Fatal("no last page")
			}
			req.After = pg.Next
		}
	}
	for _, lim := range []int{0, 1, 7, 24, 25, 1000} {
		if got := read(relaycore.TargetReadRequest{Limit: lim}); !slices.Equal(got, want) {
			t.Errorf("limit %d: %v, want %v", lim, got, want)
		}
	}
	if got := read(relaycore.TargetReadRequest{MaxBytes: 20}); !slices.Equal(got, want) {
		t.Errorf("max bytes: %v", got)
	}
	pg, err := relaycore.ReadTarget(e.ctx, e.tgt, "t", relaycore.TargetReadRequest{MaxBytes: 20})
	if err != nil || len(pg.Items) != 2 { // "k/01"+"vk/01" is 9 bytes: two fit in 20
		t.Errorf("max bytes page: %d items (%v)", len(pg.Items), err)
	}
	if got := read(relaycore.TargetReadRequest{Prefix: "k/1", Limit: 3}); !slices.Equal(got, want[9:19]) {
		t.Errorf("prefix k/1: %v", got)
	}
	if got := read(relaycore.TargetReadRequest{Prefix: "_relay/"}); len(got) != 0 {
		t.Errorf("reserved keys read: %v", got)
	}
	if got := read(relaycore.TargetReadRequest{Prefix: "nope"}); len(got) != 0 {
		t.Errorf("prefix nope: %v", got)
	}
	if pg, err := relaycore.ReadTarget(e.ctx, e.tgt, "never-written", relaycore.TargetReadRequest{}); err != nil || len(pg.Items) != 0 || pg.Next != "" {
		t.Errorf("unknown target: %+v %v", pg, err)
	}

	wm, err := relaycore.TargetWatermarks(e.ctx, e.tgt, "t")
	if err != nil {
		t.Fatal(err)
	}
	wantWM := []relaycore.SourceWatermark{{Source: "src-a", Through: 25}, {Source: "src-b", Through: 2}}
	if !slices.Equal(wm, wantWM) {
		t.Errorf("watermarks %+v, want %+v", wm, wantWM)
	}
	if wm, err := relaycore.TargetWatermarks(e.ctx, e.tgt, "never-written"); err != nil || wm == nil || len(wm) != 0 {
		t.Errorf("unknown target watermarks: %#v %v", wm, err)
	}
	if _, err := relaycore.ReadTarget(e.ctx, e.tgt, "", relaycore.TargetReadRequest{}); err == nil {
		t.Error("empty target name accepted")
	}
}
