package api_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// TestTargetReadRoutes: on the producer routes, an application reads what
// was delivered to a target: its keys page by page (prefix, after, limit;
// the engine's rh keys never appear) and each source's watermark; bad
// queries are refused, and a handler without a target store says so.
func TestTargetReadRoutes(t *testing.T) {
	r := newOpRig(t, api.RoutesProducer)
	var rows []api.RowJSON
	for i := range 5 {
		rows = append(rows, put("t1", fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)))
	}
	r.h.Routes = api.RoutesProducer
	r.enqueue(t, append(rows, put("t2", "x", "y"))...)
	r.h.Routes = api.RoutesProducer

	var wm api.TargetWatermarksResponse
	r.do(t, "GET", "/v1/targets/t1/watermarks", "", "", 200, &wm)
	if wm.Target != "t1" || wm.Watermarks == nil || len(wm.Watermarks) != 0 {
		t.Fatalf("watermarks before delivery: %+v", wm)
	}
	for res := r.alarm(t); !res.Cleared; res = r.alarm(t) {
	}
	r.do(t, "GET", "/v1/targets/t1/watermarks", "", "", 200, &wm)
	if want := []relaycore.SourceWatermark{{Source: "orders", Through: 5}}; !slices.Equal(wm.Watermarks, want) {
		t.Fatalf("watermarks %+v, want %+v", wm.Watermarks, want)
	}

	var got []string
	after := ""
	for range 10 {
		var pg api.TargetItemsResponse
		q := "limit=2"
		if after != "" {
			q += "&after=" + after
		}
		r.do(t, "GET", "/v1/targets/t1/items", q, "", 200, &pg)
		for _, it := range pg.Items {
			got = append(got, it.Key+"="+it.Value)
		}
		if after = pg.Next; after == "" {
			break
		}
	}
	want := []string{"k0=" + b64("v0"), "k1=" + b64("v1"), "k2=" + b64("v2"), "k3=" + b64("v3"), "k4=" + b64("v4")}
	if !slices.Equal(got, want) {
		t.Fatalf("items %v, want %v", got, want)
	}
	var pg api.TargetItemsResponse
	r.do(t, "GET", "/v1/targets/t1/items", "prefix=k3", "", 200, &pg)
	if len(pg.Items) != 1 || pg.Items[0].Key != "k3" || pg.Next != "" {
		t.Fatalf("prefix k3: %+v", pg)
	}
	r.do(t, "GET", "/v1/targets/nobody/items", "", "", 200, &pg)
	if pg.Items == nil || len(pg.Items) != 0 {
		t.Fatalf("unknown target: %+v (items must be [] not null)", pg)
	}

	for _, q := range []string{"limit=0", "limit=1001", "limit=x", "cursor=1", "prefix=a&prefix=b"} {
		r.do(t, "GET", "/v1/targets/t1/items", q, "", 400, nil)
	}
	r.do(t, "GET", "/v1/targets/t1/watermarks", "all=true", "", 400, nil)
	r.do(t, "GET", "/v1/targets/_relay%2Fx/items", "", "", 400, nil)
	r.do(t, "POST", "/v1/targets/t1/items", "", "{}", 405, nil)

	r.h.Relay = nil
	r.do(t, "GET", "/v1/targets/t1/items", "", "", 500, nil)
	r.h.Target = r.dst
	r.do(t, "GET", "/v1/targets/t1/items", "", "", 200, nil)
}
