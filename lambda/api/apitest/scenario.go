package apitest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Step is one request of the scenario. Settle names a source whose
// alarms the host runs first (Host.Settle); Until, when set, repeats the
// request until a 200 answer satisfies it (delivery by a host's own alarm
// clock). Check verifies values of the answer, given the earlier answers
// by step name.
type Step struct {
	Name   string
	Req    Request
	Settle string
	Until  func(body []byte) bool
	Check  func(body []byte, earlier map[string]Response) error
}

// The scenario's names. Every host starts on an empty store, so seqs are
// predictable: 1 and 2 (first enqueue), 3, then 4 and 5.
const (
	source = "conf"
	src    = "/v1/sources/" + source
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func rows(kv ...string) []byte {
	var b strings.Builder
	b.WriteString(`{"rows":[`)
	for i := 0; i+2 < len(kv)+1; i += 3 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"target":%q,"puts":[{"key":%q,"value":%q}]}`, kv[i], kv[i+1], b64(kv[i+2]))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

var jsonCT = map[string]string{"content-type": "application/json"}

func get(role Role, path, query string) Request {
	return Request{Role: role, Method: "GET", Path: path, Query: query}
}

func post(role Role, path string, body []byte, headers ...string) Request {
	h := map[string]string{"content-type": "application/json"}
	for i := 0; i+1 < len(headers); i += 2 {
		h[headers[i]] = headers[i+1]
	}
	return Request{Role: role, Method: "POST", Path: path, Headers: h, Body: body}
}

// field decodes body and returns the value at a dotted path ("" when
// absent), formatted with %v.
func field(body []byte, path string) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return ""
	}
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		if v, ok = m[k]; !ok {
			return ""
		}
	}
	if v == nil {
		return "null"
	}
	return fmt.Sprint(v)
}

// expect checks fields of the answer: path, value, path, value...
func expect(kv ...string) func([]byte, map[string]Response) error {
	return func(body []byte, _ map[string]Response) error {
		var bad []string
		for i := 0; i+1 < len(kv); i += 2 {
			if got := field(body, kv[i]); got != kv[i+1] {
				bad = append(bad, fmt.Sprintf("%s = %q, want %q", kv[i], got, kv[i+1]))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	}
}

func is(path, value string) func([]byte) bool {
	return func(body []byte) bool { return field(body, path) == value }
}

// items lists a target items page as key=value (values decoded).
func items(body []byte) []string {
	var pg struct {
		Items []struct{ Key, Value string }
	}
	if json.Unmarshal(body, &pg) != nil {
		return nil
	}
	var out []string
	for _, it := range pg.Items {
		v, _ := base64.StdEncoding.DecodeString(it.Value)
		out = append(out, it.Key+"="+string(v))
	}
	return out
}

func itemsAre(want ...string) func([]byte, map[string]Response) error {
	return func(body []byte, _ map[string]Response) error {
		if got := items(body); !slices.Equal(got, want) {
			return fmt.Errorf("items %v, want %v", got, want)
		}
		return nil
	}
}

// Scenario is the conformance scenario, in order: producer routes with
// an Idempotency-Key, the reads, the target reads, operator routes with
// bad input, then requests every route refuses alike.
func Scenario() []Step {
	first := rows("t1", "a", "1", "t2", "b", "2")
	long := strings.Repeat("r", 257)
	oversize := append([]byte(`{"rows":[{"target":"t1","puts":[{"key":"k","value":"`), bytes.Repeat([]byte("A"), 1<<20)...)
	oversize = append(oversize, `"}]}]}`...)
	return []Step{
		// Enqueue with an Idempotency-Key: first, repeat, other body.
		{Name: "enqueue", Req: post(Producer, src+"/rows", first, "idempotency-key", "conf-1"),
			Check: expect("seqs", "[1 2]", "source", source, "replayed", "")},
		{Name: "enqueue-repeat", Req: post(Producer, src+"/rows", first, "idempotency-key", "conf-1"),
			Check: expect("seqs", "[1 2]", "replayed", "true", "alarm_due_ms", "0")},
		{Name: "enqueue-key-reused", Req: post(Producer, src+"/rows", rows("t1", "a", "other"), "idempotency-key", "conf-1")},
		{Name: "enqueue-no-key", Req: post(Producer, src+"/rows", rows("t1", "c", "3")), Check: expect("seqs", "[3]")},

		// Reads, once the rows are delivered.
		{Name: "delivered-through", Req: get(Producer, src+"/delivered-through", "seq=3"), Settle: source,
			Until: is("delivered", "true")},
		{Name: "delivered-through-future", Req: get(Producer, src+"/delivered-through", "seq=99"), Check: expect("delivered", "false")},
		{Name: "delivered-through-no-seq", Req: get(Producer, src+"/delivered-through", "")},
		{Name: "delivered-through-bad-seq", Req: get(Producer, src+"/delivered-through", "seq=-1")},
		{Name: "watermark", Req: get(Producer, src+"/watermark", "")},
		{Name: "state", Req: get(Producer, src+"/state", ""), Check: expect("next_seq", "4", "empty", "true")},
		{Name: "state-operator", Req: get(Operator, src+"/state", "")},

		// Target reads.
		{Name: "target-watermarks", Req: get(Producer, "/v1/targets/t1/watermarks", ""),
			Check: expect("target", "t1")},
		{Name: "target-items", Req: get(Producer, "/v1/targets/t1/items", ""), Check: itemsAre("a=1", "c=3")},
		{Name: "target-items-page", Req: get(Producer, "/v1/targets/t1/items", "limit=1"),
			Check: func(b []byte, e map[string]Response) error {
				if err := itemsAre("a=1")(b, e); err != nil {
					return err
				}
				return expect("next", "a")(b, e)
			}},
		{Name: "target-items-after", Req: get(Operator, "/v1/targets/t1/items", "after=a&limit=1"), Check: itemsAre("c=3")},
		{Name: "target-items-unknown", Req: get(Producer, "/v1/targets/nobody/items", "")},
		{Name: "target-items-bad-limit", Req: get(Producer, "/v1/targets/t1/items", "limit=0")},
		{Name: "target-watermarks-unknown", Req: get(Producer, "/v1/targets/nobody/watermarks", "")},

		// Operator routes.
		{Name: "targets-list", Req: get(Operator, src+"/targets", "all=true")},
		{Name: "targets-list-bad-state", Req: get(Operator, src+"/targets", "state=sleepy")},
		{Name: "target-show", Req: get(Operator, src+"/targets/t1", ""), Check: expect("status.state", "active", "status.delivered_through", "3")},
		{Name: "target-show-unknown", Req: get(Operator, src+"/targets/nobody", "")},
		{Name: "pause", Req: post(Operator, src+"/targets/t1/pause", []byte(`{"reason":"maintenance"}`)),
			Check: expect("status.state", "paused", "status.note.reason", "maintenance")},
		{Name: "pause-again", Req: post(Operator, src+"/targets/t1/pause", []byte(`{}`))},
		{Name: "enqueue-held", Req: post(Producer, src+"/rows", rows("t1", "d", "4", "t1", "e", "5")), Check: expect("seqs", "[4 5]")},
		{Name: "target-held", Req: get(Operator, src+"/targets/t1", ""), Settle: source,
			Until: is("status.held_last", "5"), Check: expect("status.held_first", "4", "status.state", "paused")},
		{Name: "skip-past-last", Req: post(Operator, src+"/targets/t1/skip", []byte(`{"expect_first":4,"through":9,"reason":"bad row"}`))},
		{Name: "skip-stale-expect", Req: post(Operator, src+"/targets/t1/skip", []byte(`{"expect_first":5,"through":5,"reason":"bad row"}`)),
			Check: expect("error.actual_first", "4")},
		{Name: "skip-reason-too-long", Req: post(Operator, src+"/targets/t1/skip", []byte(`{"expect_first":4,"through":4,"reason":"`+long+`"}`))},
		{Name: "skip-no-reason", Req: post(Operator, src+"/targets/t1/skip", []byte(`{"expect_first":4,"through":4}`))},
		{Name: "skip-unknown-target", Req: post(Operator, src+"/targets/nobody/skip", []byte(`{"expect_first":1,"through":1,"reason":"x"}`))},
		{Name: "skip-active-target", Req: post(Operator, src+"/targets/t2/skip", []byte(`{"expect_first":1,"through":1,"reason":"x"}`))},
		{Name: "quarantine-reason-too-long", Req: post(Operator, src+"/targets/t2/quarantine", []byte(`{"reason":"`+long+`"}`))},
		{Name: "quarantine-unknown-target", Req: post(Operator, src+"/targets/nobody/quarantine", []byte(`{}`))},
		{Name: "release-paused", Req: post(Operator, src+"/targets/t1/release", []byte(`{}`))},
		{Name: "resume-unknown-target", Req: post(Operator, src+"/targets/nobody/resume", []byte(`{}`))},
		{Name: "action-by-in-body", Req: post(Operator, src+"/targets/t2/pause", []byte(`{"by":"mallory"}`))},
		{Name: "skip", Req: post(Operator, src+"/targets/t1/skip", []byte(`{"expect_first":4,"through":4,"reason":"bad row"}`)),
			Check: expect("rows", "1", "first", "4", "last", "4")},
		{Name: "resume", Req: post(Operator, src+"/targets/t1/resume", []byte(`{"reason":"done"}`)),
			Check: expect("status.state", "active")},
		{Name: "target-watermarks-after-resume", Req: get(Producer, "/v1/targets/t1/watermarks", ""), Settle: source,
			Until: func(b []byte) bool { return strings.Contains(string(b), `"delivered_through":5`) }},
		{Name: "target-items-after-skip", Req: get(Producer, "/v1/targets/t1/items", ""), Check: itemsAre("a=1", "c=3", "e=5")},
		{Name: "archive-list", Req: get(Operator, src+"/archive", "")},
		{Name: "quarantine", Req: post(Operator, src+"/targets/t2/quarantine", []byte(`{}`)), Check: expect("status.state", "quarantined")},
		{Name: "release", Req: post(Operator, src+"/targets/t2/release", []byte(`{}`)), Check: expect("status.state", "active")},

		// Refused alike by every route.
		{Name: "wrong-method", Req: Request{Role: Producer, Method: "DELETE", Path: src + "/state"}},
		{Name: "wrong-method-target", Req: Request{Role: Operator, Method: "PUT", Path: src + "/targets/t1", Headers: jsonCT, Body: []byte(`{}`)}},
		{Name: "unknown-route", Req: get(Producer, "/v1/nothing", "")},
		{Name: "unknown-route-deep", Req: get(Operator, src+"/targets/t1/history", "")},
		{Name: "malformed-json", Req: post(Producer, src+"/rows", []byte(`{"rows":[`))},
		{Name: "malformed-json-operator", Req: post(Operator, src+"/targets/t1/pause", []byte(`{"reason":`))},
		{Name: "unknown-field", Req: post(Producer, src+"/rows", []byte(`{"rows":[],"extra":1}`))},
		{Name: "trailing-data", Req: post(Producer, src+"/rows", append(rows("t1", "x", "y"), " {}"...))},
		{Name: "wrong-content-type", Req: Request{Role: Producer, Method: "POST", Path: src + "/rows", Headers: map[string]string{"content-type": "text/plain"}, Body: rows("t1", "x", "y")}},
		{Name: "invalid-row", Req: post(Producer, src+"/rows", []byte(`{"rows":[{"target":"t1","puts":[{"key":"k","value":"not base64!"}]}]}`)),
			Check: expect("error.row", "0")},
		{Name: "reserved-target", Req: post(Producer, src+"/rows", rows("_relay/x", "k", "v"))},
		{Name: "bad-idempotency-key", Req: post(Producer, src+"/rows", rows("t1", "x", "y"), "idempotency-key", "a b")},
		{Name: "oversize-body", Req: post(Producer, src+"/rows", oversize)},
		{Name: "unknown-query", Req: get(Producer, src+"/state", "verbose=1")},
		{Name: "get-with-body", Req: Request{Role: Producer, Method: "GET", Path: src + "/state", Headers: jsonCT, Body: []byte(`{}`)}},
		{Name: "state-after", Req: get(Producer, src+"/state", ""), Check: expect("next_seq", "6")},
	}
}
