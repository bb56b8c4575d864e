package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

const operatorARN = "arn:aws:sts::123456789012:assumed-role/relay-operator/alice"

// opRig is an operator handler over in-memory source and target stores.
type opRig struct {
	h        *api.Handler
	src, dst *mem.Store
}

func newOpRig(t *testing.T, routes api.RouteSet) *opRig {
	t.Helper()
	src, dst := mem.New(relaycore.Capabilities{}), mem.New(relaycore.Capabilities{})
	budget, err := relaycore.PlanBudget("free")
	if err != nil {
		t.Fatal(err)
	}
	k := &kicks{}
	relay := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget, Kicker: k}
	h := &api.Handler{Source: src, Enqueue: relaycore.EnqueueConfig{Kicker: k}, Relay: relay, Routes: routes}
	return &opRig{h: h, src: src, dst: dst}
}

// do serves one request through the host-independent core and decodes a
// 2xx body into out.
func (r *opRig) do(t *testing.T, method, path, query, body string, want int, out any) api.Response {
	t.Helper()
	req := api.Request{Method: method, Path: path, Query: query, Body: []byte(body), Caller: operatorARN,
		Headers: map[string]string{"content-type": "application/json"}}
	resp := r.h.Serve(t.Context(), req)
	if resp.Status != want {
		t.Fatalf("%s %s?%s: %d %s, want %d", method, path, query, resp.Status, resp.Body, want)
	}
	if !json.Valid(resp.Body) || resp.Headers["content-type"] != "application/json" {
		t.Fatalf("%s %s: not a JSON response: %q", method, path, resp.Body)
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body, out); err != nil {
			t.Fatalf("%s %s: %s: %v", method, path, resp.Body, err)
		}
	}
	return resp
}

func (r *opRig) alarm(t *testing.T) relaycore.AlarmResult {
	t.Helper()
	res, err := r.h.Relay.Alarm(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func put(target, key, value string) api.RowJSON {
	v := b64(value)
	return api.RowJSON{Target: target, Puts: []api.PutJSON{{Key: key, Value: &v}}}
}

func (r *opRig) enqueue(t *testing.T, rows ...api.RowJSON) []uint64 {
	t.Helper()
	body, _ := json.Marshal(api.EnqueueRequest{Rows: rows})
	var res api.EnqueueResponse
	r.h.Routes = api.RoutesAll
	defer func() { r.h.Routes = api.RoutesOperator }()
	r.do(t, "POST", "/v1/sources/orders/rows", "", string(body), 200, &res)
	return res.Seqs
}

func (r *opRig) value(t *testing.T, target, key string) string {
	t.Helper()
	v, ok, err := r.dst.Get(t.Context(), relaycore.Partition(target), key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return "<absent>"
	}
	return string(v)
}

// TestOperatorRoundTrip: quarantine a target, let a fire hold its rows,
// skip the poison row (a stale expect_first and a range past the held rows
// are refused first), release, and the rest is delivered in order; the
// archive lists, exports and re-enqueues the skipped row.
func TestOperatorRoundTrip(t *testing.T) {
	r := newOpRig(t, api.RoutesOperator)
	seqs := r.enqueue(t, put("t1", "k", "poison"), put("t1", "k", "v2"), put("t1", "j", "v3"), put("t2", "k", "ok"))
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4}) {
		t.Fatalf("seqs %v", seqs)
	}
	var tr api.TargetResponse
	r.do(t, "POST", "/v1/sources/orders/targets/t1/quarantine", "", `{"reason":"refuses order 1"}`, 200, &tr)
	if tr.Status.State != relaycore.StateQuarantined || tr.Status.Note == nil || tr.Status.Note.By != "123456789012:assumed-role/relay-operator/alice" || tr.Status.Note.Reason != "refuses order 1" {
		t.Fatalf("quarantine answered %+v (note %+v)", tr.Status, tr.Status.Note)
	}
	r.alarm(t)
	if got := r.value(t, "t2", "k"); got != "ok" {
		t.Errorf("healthy target t2: %q", got)
	}
	if got := r.value(t, "t1", "k"); got != "<absent>" {
		t.Errorf("quarantined t1 received %q", got)
	}

	var list api.TargetsResponse
	r.do(t, "GET", "/v1/sources/orders/targets", "state=quarantined", "", 200, &list)
	if len(list.Targets) != 1 || list.Targets[0].Target != "t1" || list.Targets[0].Held != 3 || list.Targets[0].HeldFirst != 1 || list.Targets[0].HeldLast != 3 {
		t.Fatalf("quarantined targets %+v", list.Targets)
	}
	r.do(t, "GET", "/v1/sources/orders/targets/t1", "", "", 200, &tr)
	if tr.Status.HeldFirst != 1 {
		t.Fatalf("target t1 %+v", tr.Status)
	}

	// A stale expect_first is a conflict naming the actual first seq.
	var eb api.ErrorBody
	r.do(t, "POST", "/v1/sources/orders/targets/t1/skip", "", `{"expect_first":2,"through":2,"reason":"poison"}`, 409, &eb)
	if eb.Error.Code != "skip_conflict" || eb.Error.ActualFirst == nil || *eb.Error.ActualFirst != 1 {
		t.Fatalf("stale skip: %+v", eb.Error)
	}
	var skip api.SkipResponse
	r.do(t, "POST", "/v1/sources/orders/targets/t1/skip", "", `{"expect_first":1,"through":1,"reason":"poison"}`, 200, &skip)
	if skip.ArchiveID != 1 || skip.Rows != 1 || skip.First != 1 || skip.Last != 1 || skip.Status.HeldFirst != 2 {
		t.Fatalf("skip answered %+v", skip)
	}
	r.do(t, "POST", "/v1/sources/orders/targets/t1/release", "", `{}`, 200, &tr)
	if tr.Status.State != relaycore.StateActive {
		t.Fatalf("release answered %+v", tr.Status)
	}
	r.alarm(t)
	if k, j := r.value(t, "t1", "k"), r.value(t, "t1", "j"); k != "v2" || j != "v3" {
		t.Errorf("after release t1 has k=%q j=%q, want v2 v3 (the skipped row never applied)", k, j)
	}

	var al api.ArchiveListResponse
	r.do(t, "GET", "/v1/sources/orders/archive", "", "", 200, &al)
	if len(al.Entries) != 1 || al.Entries[0].ID != 1 || al.Entries[0].Rows != 1 || al.Entries[0].Reason != "poison" || al.Entries[0].Target != "t1" {
		t.Fatalf("archive %+v", al)
	}
	var ex api.ArchiveExportResponse
	r.do(t, "GET", "/v1/sources/orders/archive/export", "", "", 200, &ex)
	if len(ex.Entries) != 1 || ex.Next != "" || len(ex.Entries[0].Data) != 1 || ex.Entries[0].Data[0].Seq != 1 || *ex.Entries[0].Data[0].Puts[0].Value != b64("poison") {
		t.Fatalf("export %+v", ex)
	}
	var rq api.RequeueResponse
	r.do(t, "POST", "/v1/sources/orders/archive/1/requeue", "", `{}`, 200, &rq)
	if !slices.Equal(rq.Seqs, []uint64{5}) {
		t.Fatalf("requeue %+v", rq)
	}
	dump := r.src.Dump()
	r.do(t, "POST", "/v1/sources/orders/archive/1/requeue", "", `{}`, 200, &rq)
	if !slices.Equal(rq.Seqs, []uint64{5}) || !reflect.DeepEqual(r.src.Dump(), dump) {
		t.Fatalf("second requeue %+v, or it wrote", rq)
	}
	r.alarm(t)
	if got := r.value(t, "t1", "k"); got != "poison" {
		t.Errorf("requeued row: t1 k = %q", got)
	}
}

// TestOperatorRefusals: each bad operator request gets its 4xx JSON error
// and leaves both stores exactly as they were.
func TestOperatorRefusals(t *testing.T) {
	const tp = "/v1/sources/orders/targets/t1/"
	long := strings.Repeat("r", relaycore.MaxReasonLen+1)
	for _, tc := range []struct {
		name, method, path, query, body string
		status                          int
		code                            string
	}{
		{"unknown target", "POST", "/v1/sources/orders/targets/nobody/quarantine", "", `{}`, 404, "unknown_target"},
		{"unknown target get", "GET", "/v1/sources/orders/targets/nobody", "", "", 404, "unknown_target"},
		{"wrong method", "GET", tp + "quarantine", "", "", 405, "method_not_allowed"},
		{"wrong method on targets", "POST", "/v1/sources/orders/targets", "", `{}`, 405, "method_not_allowed"},
		{"release an active target", "POST", tp + "release", "", `{}`, 409, "wrong_state"},
		{"resume a quarantined target", "POST", "/v1/sources/orders/targets/t2/resume", "", `{}`, 409, "wrong_state"},
		{"skip an active target", "POST", tp + "skip", "", `{"expect_first":1,"through":1,"reason":"x"}`, 409, "wrong_state"},
		{"skip past the last held seq", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":3,"through":9,"reason":"x"}`, 422, "skip_range"},
		{"skip without reason", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":3,"through":3}`, 400, "bad_request"},
		{"skip backwards", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":3,"through":2,"reason":"x"}`, 400, "bad_request"},
		{"skip from zero", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":0,"through":2,"reason":"x"}`, 400, "bad_request"},
		{"reason too long", "POST", tp + "quarantine", "", `{"reason":"` + long + `"}`, 400, "bad_request"},
		{"reason with control characters", "POST", tp + "quarantine", "", `{"reason":"a\u0007b"}`, 400, "bad_request"},
		// The engine's rule (Actor.Validate), before the target is read.
		{"control characters, unknown target", "POST", "/v1/sources/orders/targets/nobody/pause", "", `{"reason":"a\u0007b"}`, 400, "bad_request"},
		{"skip reason not UTF-8 text", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":2,"through":2,"reason":"a\u001bb"}`, 400, "bad_request"},
		{"malformed json", "POST", tp + "quarantine", "", `{"reason":`, 400, "bad_request"},
		{"no body", "POST", tp + "quarantine", "", ``, 400, "bad_request"},
		{"unknown field", "POST", tp + "quarantine", "", `{"reason":"x","by":"mallory"}`, 400, "bad_request"},
		// encoding/json alone reads the last, or a field in another case:
		// this skip would archive seqs 2..9, not 2.
		{"skip with a field repeated in another case", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":2,"through":2,"reason":"x","Through":9}`, 400, "bad_request"},
		{"skip with a field repeated", "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":2,"through":2,"through":9,"reason":"x"}`, 400, "bad_request"},
		{"trailing data", "POST", tp + "pause", "", `{} {}`, 400, "bad_request"},
		{"query on action", "POST", tp + "pause", "force=1", `{}`, 400, "bad_request"},
		{"bad state filter", "GET", "/v1/sources/orders/targets", "state=stuck", "", 400, "bad_request"},
		{"bad limit", "GET", "/v1/sources/orders/targets", "limit=0", "", 400, "bad_request"},
		{"bad all", "GET", "/v1/sources/orders/targets", "all=yes", "", 400, "bad_request"},
		{"unknown archive entry", "GET", "/v1/sources/orders/archive/7", "", "", 404, "unknown_archive_entry"},
		{"requeue unknown entry", "POST", "/v1/sources/orders/archive/7/requeue", "", `{}`, 404, "unknown_archive_entry"},
		{"archive entry zero", "GET", "/v1/sources/orders/archive/0", "", "", 400, "bad_request"},
		{"archive entry not a number", "GET", "/v1/sources/orders/archive/x1", "", "", 404, "not_found"},
		{"bad export cursor", "GET", "/v1/sources/orders/archive/export", "cursor=a.b", "", 400, "bad_request"},
		{"archive limit too high", "GET", "/v1/sources/orders/archive", "limit=101", "", 400, "bad_request"},
		{"enqueue is a producer route", "POST", "/v1/sources/orders/rows", "", goodBody, 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newOpRig(t, api.RoutesOperator)
			// t1 active with a row; t2 quarantined with rows 2..3 held.
			r.enqueue(t, put("t1", "k", "v1"), put("t2", "k", "v2"), put("t2", "k", "v3"))
			r.do(t, "POST", "/v1/sources/orders/targets/t2/quarantine", "", `{}`, 200, nil)
			if _, err := r.h.Relay.Fire(t.Context(), "orders"); err != nil {
				t.Fatal(err)
			}
			r.do(t, "GET", "/v1/sources/orders/targets/t2", "", "", 200, nil)
			src, dst := r.src.Dump(), r.dst.Dump()
			var eb api.ErrorBody
			resp := r.do(t, tc.method, tc.path, tc.query, tc.body, tc.status, &eb)
			if eb.Error.Code != tc.code || eb.Error.Message == "" {
				t.Errorf("got %s, want code %s", resp.Body, tc.code)
			}
			if tc.status == 405 && resp.Headers["allow"] == "" {
				t.Error("405 without an allow header")
			}
			if !reflect.DeepEqual(r.src.Dump(), src) || !reflect.DeepEqual(r.dst.Dump(), dst) {
				t.Error("a refused request changed the stores")
			}
		})
	}
}

// TestSkipConflictReleasesClaim: a stale expect_first is only known under
// the source's claim, so the engine takes and releases it (rs is
// rewritten); nothing else changes and the claim is free again.
func TestSkipConflictReleasesClaim(t *testing.T) {
	r := newOpRig(t, api.RoutesOperator)
	r.enqueue(t, put("t2", "k", "v2"), put("t2", "k", "v3"))
	r.do(t, "POST", "/v1/sources/orders/targets/t2/pause", "", `{"reason":"maintenance"}`, 200, nil)
	r.alarm(t)
	before := r.src.Dump()["orders"]
	var eb api.ErrorBody
	r.do(t, "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":2,"through":2,"reason":"x"}`, 409, &eb)
	if eb.Error.Code != "skip_conflict" || *eb.Error.ActualFirst != 1 {
		t.Fatalf("%+v", eb.Error)
	}
	after := r.src.Dump()["orders"]
	strip := func(items []relaycore.Item) []relaycore.Item {
		return slices.DeleteFunc(slices.Clone(items), func(it relaycore.Item) bool { return it.Key == relaycore.KeyRS })
	}
	if !reflect.DeepEqual(strip(before), strip(after)) {
		t.Error("a refused skip changed more than rs")
	}
	// The claim is released: the right skip goes through at once.
	r.do(t, "POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":1,"through":1,"reason":"x"}`, 200, nil)
}

// TestSourceBusy: while a fire holds the source's claim past the
// handler's BusyWait an action answers 503 source_busy with Retry-After and
// changes nothing.
func TestSourceBusy(t *testing.T) {
	r := newOpRig(t, api.RoutesOperator)
	r.h.BusyWait = -1 // answer at once
	r.enqueue(t, put("t1", "k", "v1"))
	hold := &relaycore.RelayHandler{Source: r.src, Target: blockingStore{r.dst, make(chan struct{}), make(chan struct{})}, Budget: r.h.Relay.Budget}
	bs := hold.Target.(blockingStore)
	done := make(chan error)
	go func() { _, err := hold.Fire(t.Context(), "orders"); done <- err }()
	<-bs.entered // the fire holds the claim and is applying
	src := r.src.Dump()
	var eb api.ErrorBody
	resp := r.do(t, "POST", "/v1/sources/orders/targets/t1/pause", "", `{}`, 503, &eb)
	if eb.Error.Code != "source_busy" || resp.Headers["retry-after"] != "1" {
		t.Errorf("busy: %s headers %v", resp.Body, resp.Headers)
	}
	if !reflect.DeepEqual(r.src.Dump(), src) {
		t.Error("a refused action changed the source")
	}
	close(bs.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSourceBusyWaits: an action that meets a running fire waits for it
// (Handler.BusyWait) and then succeeds, instead of answering 503: the
// fire is released only after the action has found the claim taken and
// tried again.
func TestSourceBusyWaits(t *testing.T) {
	r := newOpRig(t, api.RoutesOperator)
	r.h.BusyWait = time.Hour // the test ends the wait, not the clock
	r.enqueue(t, put("t1", "k", "v1"))
	claims := &rsReads{Store: r.src, seen: make(chan struct{}, 64)}
	r.h.Relay.Source = claims
	hold := &relaycore.RelayHandler{Source: r.src, Target: blockingStore{r.dst, make(chan struct{}), make(chan struct{})}, Budget: r.h.Relay.Budget}
	bs := hold.Target.(blockingStore)
	done := make(chan error)
	go func() { _, err := hold.Fire(t.Context(), "orders"); done <- err }()
	<-bs.entered // the fire holds the claim and is applying

	type answer struct {
		resp api.Response
	}
	answered := make(chan answer, 1)
	go func() {
		req := api.Request{Method: "POST", Path: "/v1/sources/orders/targets/t1/pause", Body: []byte(`{}`), Caller: operatorARN,
			Headers: map[string]string{"content-type": "application/json"}}
		answered <- answer{r.h.Serve(t.Context(), req)}
	}()
	// Two claim reads: the first found the fire's claim, the second is
	// the retry. An action that does not wait answers after the first.
	for range 2 {
		select {
		case <-claims.seen:
		case a := <-answered:
			close(bs.release)
			<-done
			t.Fatalf("answered %d %s before trying the claim again", a.resp.Status, a.resp.Body)
		}
	}
	close(bs.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a := <-answered
	if a.resp.Status != 200 {
		t.Fatalf("pause after the fire: %d %s, want 200", a.resp.Status, a.resp.Body)
	}
	var tr api.TargetResponse
	if err := json.Unmarshal(a.resp.Body, &tr); err != nil || tr.Status.State != relaycore.StatePaused {
		t.Fatalf("pause answered %s (%v)", a.resp.Body, err)
	}
}

// rsReads reports each read of a source's rs (each claim attempt).
type rsReads struct {
	relaycore.Store
	seen chan struct{}
}

func (s *rsReads) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if key == relaycore.KeyRS {
		select {
		case s.seen <- struct{}{}:
		default:
		}
	}
	return s.Store.Get(ctx, p, key)
}

// blockingStore holds the first Apply until released.
type blockingStore struct {
	relaycore.Store
	entered, release chan struct{}
}

func (b blockingStore) Apply(ctx context.Context, p relaycore.Partition, batch relaycore.Batch) error {
	select {
	case <-b.entered:
	default:
		close(b.entered)
		<-b.release
	}
	return b.Store.Apply(ctx, p, batch)
}

// TestRouteSets: the producer set refuses operator routes with 404 and the
// operator set refuses enqueue; reads are in both; an unknown set value is
// an error.
func TestRouteSets(t *testing.T) {
	for _, tc := range []struct {
		set    api.RouteSet
		method string
		path   string
		want   int
	}{
		{api.RoutesProducer, "GET", "/v1/sources/orders/targets", 404},
		{api.RoutesProducer, "POST", "/v1/sources/orders/targets/t1/quarantine", 404},
		{api.RoutesProducer, "GET", "/v1/sources/orders/archive/export", 404},
		{api.RoutesProducer, "GET", "/v1/sources/orders/state", 200},
		{api.RoutesOperator, "POST", "/v1/sources/orders/rows", 404},
		{api.RoutesOperator, "GET", "/v1/sources/orders/state", 200},
		{api.RoutesOperator, "GET", "/v1/sources/orders/targets", 200},
		{api.RoutesAll, "GET", "/v1/sources/orders/targets", 200},
		{"", "GET", "/v1/sources/orders/targets", 404}, // zero value: producer
	} {
		t.Run(fmt.Sprintf("%s %s %s", tc.set, tc.method, tc.path), func(t *testing.T) {
			r := newOpRig(t, tc.set)
			body := ""
			if tc.method == "POST" {
				body = `{}`
			}
			var eb api.ErrorBody
			r.do(t, tc.method, tc.path, "", body, tc.want, &eb)
			if tc.want == 404 && (eb.Error.Code != "not_found" || !strings.Contains(eb.Error.Message, "not served here")) {
				t.Errorf("%+v", eb.Error)
			}
			if len(r.src.Dump()) != 0 {
				t.Error("wrote")
			}
		})
	}
	for in, want := range map[string]api.RouteSet{"": api.RoutesProducer, "producer": api.RoutesProducer, "operator": api.RoutesOperator, " all ": api.RoutesAll} {
		if got, err := api.ParseRouteSet(in); err != nil || got != want {
			t.Errorf("ParseRouteSet(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"Operator", "admin", "producer,operator"} {
		if _, err := api.ParseRouteSet(in); err == nil {
			t.Errorf("ParseRouteSet(%q) accepted", in)
		}
	}
}

// TestActorFromCaller: the actor is the caller's verified identity, short
// enough for the engine's limit, never a body field.
func TestActorFromCaller(t *testing.T) {
	for _, caller := range []string{
		operatorARN,
		"arn:aws:sts::123456789012:assumed-role/" + strings.Repeat("r", 64) + "/" + strings.Repeat("s", 64),
		"arn:aws-us-gov:iam::123456789012:user/bob",
	} {
		r := newOpRig(t, api.RoutesOperator)
		r.enqueue(t, put("t1", "k", "v1"))
		resp := r.h.Serve(t.Context(), api.Request{Method: "POST", Path: "/v1/sources/orders/targets/t1/pause", Body: []byte(`{}`),
			Caller: caller, Headers: map[string]string{"content-type": "application/json"}})
		var tr api.TargetResponse
		if err := json.Unmarshal(resp.Body, &tr); err != nil || resp.Status != 200 {
			t.Fatalf("%s: %d %s", caller, resp.Status, resp.Body)
		}
		by := tr.Status.Note.By
		if len(by) > relaycore.MaxActorLen || strings.HasPrefix(by, "arn:") || !strings.HasPrefix(by, "123456789012:") {
			t.Errorf("caller %s recorded as %q", caller, by)
		}
	}
	r := newOpRig(t, api.RoutesOperator)
	resp := r.h.Serve(t.Context(), api.Request{Method: "GET", Path: "/v1/sources/orders/targets"})
	if resp.Status != 403 {
		t.Errorf("no caller: %d %s", resp.Status, resp.Body)
	}
}

// TestExportPages: an export larger than a page is cut at row boundaries,
// an entry larger than a page is split with rows_from/partial, every row
// comes back exactly once and in order, and a page stays within the limit
// (save for a single row larger than the limit).
func TestExportPages(t *testing.T) {
	r := newOpRig(t, api.RoutesOperator)
	r.h.MaxExportBytes = 700
	var rows []api.RowJSON
	for i := range 12 {
		rows = append(rows, put("t1", fmt.Sprintf("k%02d", i), strings.Repeat("x", 40)))
	}
	r.enqueue(t, rows...)
	r.do(t, "POST", "/v1/sources/orders/targets/t1/quarantine", "", `{}`, 200, nil)
	r.alarm(t)
	// Three skips: entries of 2, 9 and 1 rows.
	for _, s := range [][2]int{{1, 2}, {3, 11}, {12, 12}} {
		r.do(t, "POST", "/v1/sources/orders/targets/t1/skip", "", fmt.Sprintf(`{"expect_first":%d,"through":%d,"reason":"x"}`, s[0], s[1]), 200, nil)
	}
	var seen []uint64
	cursor, pages := "", 0
	for {
		var ex api.ArchiveExportResponse
		q := ""
		if cursor != "" {
			q = "cursor=" + cursor
		}
		resp := r.do(t, "GET", "/v1/sources/orders/archive/export", q, "", 200, &ex)
		if len(resp.Body) > r.h.MaxExportBytes {
			t.Errorf("page %d is %d bytes, limit %d", pages, len(resp.Body), r.h.MaxExportBytes)
		}
		pages++
		for _, e := range ex.Entries {
			for i, d := range e.Data {
				if want := e.First + uint64(e.RowsFrom+i); d.Seq != want {
					t.Errorf("entry %d row %d: seq %d, want %d", e.ID, e.RowsFrom+i, d.Seq, want)
				}
				seen = append(seen, d.Seq)
			}
		}
		if ex.Next == "" {
			break
		}
		cursor = ex.Next
		if pages > 20 {
			t.Fatal("export does not end")
		}
	}
	want := make([]uint64, 12)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(seen, want) || pages < 3 {
		t.Errorf("exported seqs %v in %d pages, want 1..12 in several", seen, pages)
	}
}

// FuzzOperatorRequest: any path, query and body on the operator routes is
// answered with JSON, and a refusal leaves the stores as they were.
func FuzzOperatorRequest(f *testing.F) {
	f.Add("POST", "/v1/sources/orders/targets/t2/skip", "", `{"expect_first":1,"through":2,"reason":"x"}`)
	f.Add("POST", "/v1/sources/orders/targets/t1/quarantine", "", `{"reason":"down"}`)
	f.Add("GET", "/v1/sources/orders/targets", "state=quarantined&limit=2&after=t1", "")
	f.Add("GET", "/v1/sources/orders/archive/export", "cursor=1.2", "")
	f.Add("POST", "/v1/sources/orders/archive/1/requeue", "", `{}`)
	f.Fuzz(func(t *testing.T, method, path, query, body string) {
		r := newOpRig(t, api.RoutesOperator)
		r.enqueue(t, put("t1", "k", "v1"), put("t2", "k", "v2"))
		src, dst := r.src.Dump(), r.dst.Dump()
		resp := r.h.Serve(t.Context(), api.Request{Method: method, Path: path, Query: query, Body: []byte(body), Caller: operatorARN,
			Headers: map[string]string{"content-type": "application/json"}})
		if !json.Valid(resp.Body) || resp.Status < 200 || resp.Status > 599 {
			t.Fatalf("%d %q", resp.Status, resp.Body)
		}
		if resp.Status >= 400 && (!reflect.DeepEqual(r.src.Dump(), src) || !reflect.DeepEqual(r.dst.Dump(), dst)) && resp.Status != 409 {
			t.Fatalf("refused with %d %s but changed the stores", resp.Status, resp.Body)
		}
	})
}

// A target name is any bytes (relaycore.TargetNameProblem), so one that
// is not UTF-8, enqueued by a Go program through the engine, is named in
// the operator routes and the target reads percent-encoded, like any
// other: it was refused 400. A JSON body whose bytes are not UTF-8 is
// refused rather than read with U+FFFD in their place.
func TestNonUTF8TargetInRoutes(t *testing.T) {
	r := newOpRig(t, api.RoutesAll)
	const target = "t\xff\x00bin"
	if _, err := (&relaycore.RelayHandler{Source: r.src, Clock: relaycore.SystemClock{}}).Enqueue(t.Context(), "orders", []relaycore.Row{{Target: target, Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	r.alarm(t)
	const enc = "t%FF%00bin"
	var st api.TargetResponse
	r.do(t, "GET", "/v1/sources/orders/targets/"+enc, "", "", 200, &st)
	if st.Status.TargetHex != "74ff0062696e" {
		t.Fatalf("target_hex %q, want the name's bytes 74ff0062696e (JSON cannot show them)", st.Status.TargetHex)
	}
	r.do(t, "POST", "/v1/sources/orders/targets/"+enc+"/pause", "", `{"reason":"binary target"}`, 200, nil)
	r.do(t, "POST", "/v1/sources/orders/targets/"+enc+"/resume", "", `{}`, 200, nil)
	var items api.TargetItemsResponse
	r.do(t, "GET", "/v1/targets/"+enc+"/items", "", "", 200, &items)
	if len(items.Items) != 1 || items.Items[0].Key != "k" || items.TargetHex != "74ff0062696e" {
		t.Fatalf("items of the binary target: %+v; want key k and target_hex 74ff0062696e", items)
	}
	var wm api.TargetWatermarksResponse
	r.do(t, "GET", "/v1/targets/"+enc+"/watermarks", "", "", 200, &wm)
	if wm.TargetHex != "74ff0062696e" || len(wm.Watermarks) != 1 {
		t.Fatalf("watermarks of the binary target: %+v; want one and target_hex 74ff0062696e", wm)
	}
	// The rule's other edges still hold in paths.
	r.do(t, "GET", "/v1/sources/orders/targets/_relay%2Fx", "", "", 400, nil)
	r.do(t, "GET", "/v1/sources/orders/targets/"+strings.Repeat("x", 256), "", "", 400, nil)
	r.do(t, "GET", "/v1/sources/s%FF/state", "", "", 400, nil) // a source id is text

	r.h.Routes = api.RoutesAll
	resp := r.do(t, "POST", "/v1/sources/orders/rows", "", "{\"rows\":[{\"target\":\"t\xff\",\"puts\":[{\"key\":\"k\",\"value\":\"\"}]}]}", 400, nil)
	if !strings.Contains(string(resp.Body), "UTF-8") {
		t.Fatalf("a body that is not UTF-8: %s", resp.Body)
	}
	// Half a surrogate pair, escaped, is no character: encoding/json
	// would read U+FFFD and relay to a target nobody named.
	for _, name := range []string{`t\ud800`, `t\udc00x`, `t\ud800\u0041`} {
		resp = r.do(t, "POST", "/v1/sources/orders/rows", "", `{"rows":[{"target":"`+name+`","puts":[{"key":"k","value":""}]}]}`, 400, nil)
		if !strings.Contains(string(resp.Body), "surrogate") {
			t.Fatalf("target %s: %s", name, resp.Body)
		}
	}
	// A whole pair is a character, and an escaped backslash before "u" is
	// no escape.
	r.do(t, "POST", "/v1/sources/orders/rows", "", `{"rows":[{"target":"t\ud83d\ude00","puts":[{"key":"\\ud800","value":""}]}]}`, 200, nil)
	// Operator bodies are read by the same rule.
	resp = r.do(t, "POST", "/v1/sources/orders/targets/"+enc+"/pause", "", "{\"reason\":\"r\xff\"}", 400, nil)
	if !strings.Contains(string(resp.Body), "UTF-8") {
		t.Fatalf("an operator body that is not UTF-8: %s", resp.Body)
	}
	resp = r.do(t, "POST", "/v1/sources/orders/targets/"+enc+"/pause", "", `{"reason":"r\udfff"}`, 400, nil)
	if !strings.Contains(string(resp.Body), "surrogate") {
		t.Fatalf("an operator body with half a surrogate pair: %s", resp.Body)
	}
}
