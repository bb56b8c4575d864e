package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// rowsBody is an enqueue body as producers' encoding/json writes one from
// api.EnqueueRequest ("deletes":null and all): n rows of one put each, a
// valueBytes-byte value, spread over 8 targets, as bench's serve load.
func rowsBody(n, valueBytes int) []byte {
	var req api.EnqueueRequest
	for i := range n {
		v := make([]byte, valueBytes)
		for j := range v {
			v[j] = byte(i*31 + j*7)
		}
		s := base64.StdEncoding.EncodeToString(v)
		req.Rows = append(req.Rows, api.RowJSON{Target: fmt.Sprintf("tgt-%03d", i%8), Puts: []api.PutJSON{{Key: fmt.Sprintf("user/%011d", i), Value: &s}}})
	}
	b, err := json.Marshal(req)
	if err != nil {
		panic(err)
	}
	return b
}

const testMaxRows = 8

// Bodies the scanner must take, each decoded exactly as encoding/json's
// path decodes it.
var fastBodies = []string{
	goodBody,
	string(rowsBody(testMaxRows, 200)),
	`{"rows":[{"target":"t","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","puts":null,"deletes":null}]}`,
	`{"rows":[{"target":"t","puts":[],"deletes":[]}]}`,
	`{"rows":[{"deletes":["a","b"],"puts":[{"value":"AAE=","key":"k"}],"target":"t"}]}`,
	" \t\r\n{ \"rows\" : [ { \"target\" : \"t\" , \"puts\" : [ { \"key\" : \"k\" , \"value\" : \"\" } , { \"key\" : \"j\" , \"value\" : \"/+8=\" } ] , \"deletes\" : [ \"d\" , \"e\" ] } , {\"target\":\"u\"} ] } \n",
	`{"rows":[{"target":"café ☕","puts":[{"key":"ключ/𝄞","value":"YQ=="}],"deletes":["ü"]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"","value":"YQ=="}],"deletes":[""]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ=="}]},{"target":"t","puts":[{"key":"k","value":"YWI="}]},{"target":"u","puts":[{"key":"k","value":"YWJj"}]}]}`,
	`{"rows":[{"target":"a"},{"target":"b"},{"target":"c"},{"target":"d"},{"target":"e"},{"target":"f"},{"target":"g"},{"target":"h"}]}`,
	`{"rows":[{"target":"a"},{"target":"b"},{"target":"c"},{"target":"a"},{"target":"d"},{"target":"e"},{"target":"f"},{"target":"b"}]}`,
	`{"rows":[{"target":"` + strings.Repeat("x", relaycore.MaxPartitionLen) + `"}]}`,
}

// Bodies the scanner must leave to encoding/json: the ones it refuses,
// and the ones it takes that the scanner does not read (escapes, names by
// case, duplicates, nulls for strings, a missing key).
var declinedBodies = []string{
	// Escapes, anywhere.
	`{"rows":[{"target":"t\u0031","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","deletes":["k\/1"]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k\n","value":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ\u003d\u003d"}]}]}`,
	`{"r\u006fws":[{"target":"t","deletes":["k"]}]}`,
	`{"rows":[{"t\u0061rget":"t","deletes":["k"]}]}`,
	// Names matched by case, which encoding/json does.
	`{"Rows":[{"target":"t","deletes":["k"]}]}`,
	`{"rows":[{"TARGET":"t","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","Puts":[{"key":"k","value":""}]}]}`,
	`{"rows":[{"target":"t","Deletes":["k"]}]}`,
	`{"rows":[{"target":"t","puts":[{"Key":"k","value":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","VALUE":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","ſalue":""}]}]}`,
	// Duplicates, of which encoding/json takes the last.
	`{"rows":[{"target":"t","deletes":["k"]}],"rows":[{"target":"u","deletes":["j"]}]}`,
	`{"rows":[{"target":"t","target":"u","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":""}],"puts":[{"key":"j","value":""}]}]}`,
	`{"rows":[{"target":"t","deletes":["k"],"deletes":["j"]}]}`,
	`{"rows":[{"target":"t","deletes":["k"],"deletes":null}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","key":"j","value":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"","value":"YQ=="}]}]}`,
	// Nulls where a string or the rows are expected.
	`{"rows":null}`,
	`null`,
	`{"rows":[null]}`,
	`{"rows":[{"target":null,"deletes":["k"]}]}`,
	`{"rows":[{"target":"t","puts":[null]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":null,"value":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":null}]}]}`,
	`{"rows":[{"target":"t","deletes":[null]}]}`,
	// Numbers, booleans, nesting other than the shape's.
	`{"rows":[{"target":1,"deletes":["k"]}]}`,
	`{"rows":[{"target":"t","deletes":[1]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":1}]}]}`,
	`{"rows":[{"target":"t","deletes":true}]}`,
	`{"rows":{"target":"t","deletes":["k"]}}`,
	`{"rows":[[{"target":"t","deletes":["k"]}]]}`,
	`{"rows":[{"target":"t","puts":{"key":"k","value":""}}]}`,
	`{"rows":[{"target":"t","deletes":[["k"]]}]}`,
	`{"rows":[{"target":["t"],"deletes":["k"]}]}`,
	`[{"rows":[{"target":"t","deletes":["k"]}]}]`,
	`"rows"`,
	``,
	// Unknown members.
	`{"rows":[{"target":"t","deletes":["k"]}],"more":1}`,
	`{"rows":[{"target":"t","deletes":["k"],"seq":1}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"","ttl":1}]}]}`,
	`{"rows":[{"target":"t","deletes":["k"]}],"":null}`,
	// Missing members.
	`{}`,
	`{"rows":[{"deletes":["k"]}]}`,
	`{"rows":[{}]}`,
	`{"rows":[{"target":"t","puts":[{"value":""}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k"}]}]}`,
	`{"rows":[{"target":"t","puts":[{}]}]}`,
	// Refused rows: none, too many, bad targets, bad values.
	`{"rows":[]}`,
	string(rowsBody(testMaxRows+1, 1)),
	`{"rows":[{"target":"","deletes":["k"]}]}`,
	`{"rows":[{"target":"` + relaycore.ReservedPrefix + `x","deletes":["k"]}]}`,
	`{"rows":[{"target":"` + strings.Repeat("x", relaycore.MaxPartitionLen+1) + `"}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ"}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YR=="}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ==YQ=="}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"Y Q=="}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ==\n"}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"YQ-_"}]}]}`,
	`{"rows":[{"target":"t","puts":[{"key":"k","value":"ÿÿÿÿ"}]}]}`,
	// Trailing data, and malformed JSON.
	`{"rows":[{"target":"t","deletes":["k"]}]}{}`,
	`{"rows":[{"target":"t","deletes":["k"]}]} x`,
	`{"rows":[{"target":"t","deletes":["k"]}]}` + "\x00",
	`{"rows":[{"target":"t","deletes":["k"]},]}`,
	`{"rows":[{"target":"t","deletes":["k",]}]}`,
	`{"rows":[{"target":"t","deletes":["k"],}]}`,
	`{"rows":[{"target":"t","deletes":["k"]}],}`,
	`{"rows":[{"target":"t" "deletes":["k"]}]}`,
	`{"rows":[{"target":"t","deletes":["k"]}]`,
	`{"rows":[{"target":"t","deletes":["k`,
	`{"rows":[{"target":"t","deletes":nul}]}`,
	`{"rows":[{"target":"t","deletes":nullx}]}`,
	`{"rows"=[{"target":"t","deletes":["k"]}]}`,
	"\ufeff" + `{"rows":[{"target":"t","deletes":["k"]}]}`,
	"\v" + `{"rows":[{"target":"t","deletes":["k"]}]}`,
	`{"rows":[{"target":"t` + "\t" + `","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","deletes":["k` + "\x7f\x1f" + `"]}]}`,
	// Invalid UTF-8, in strings and out.
	`{"rows":[{"target":"t` + "\xff" + `","deletes":["k"]}]}`,
	`{"rows":[{"target":"t","deletes":["` + "\xed\xa0\x80" + `"]}]}`,
	`{"rows":[{"target":"t","deletes":["` + "\xc3" + `"]}]}`,
	`{"rows":[{"target":"t","deletes":["k"]}]}` + "\xc3\xa9",
	"\xc3\xa9" + `{"rows":[{"target":"t","deletes":["k"]}]}`,
}

// sameResult fails t unless ParseRows' answer for body is encoding/json's
// path's: deep-equal rows (nil and empty slices as that path has them) or
// the same error.
func sameResult(t *testing.T, body []byte) {
	t.Helper()
	rows, err := api.ParseRows(body, testMaxRows)
	want, wantErr := api.ParseRowsJSON(body, testMaxRows)
	if !reflect.DeepEqual(rows, want) || !reflect.DeepEqual(err, wantErr) {
		t.Fatalf("body %q:\nParseRows     %#v, %v\nencoding/json %#v, %v", body, rows, err, want, wantErr)
	}
}

func TestParseRowsFastTakes(t *testing.T) {
	for _, body := range fastBodies {
		rows, ok := api.ParseRowsFast([]byte(body), testMaxRows)
		if !ok {
			t.Errorf("scanner declined %q", body)
			continue
		}
		want, err := api.ParseRowsJSON([]byte(body), testMaxRows)
		if err != nil || !reflect.DeepEqual(rows, want) {
			t.Errorf("body %q:\nscanner       %#v\nencoding/json %#v, %v", body, rows, want, err)
		}
		sameResult(t, []byte(body))
	}
}

func TestParseRowsFastDeclines(t *testing.T) {
	for _, body := range declinedBodies {
		if rows, ok := api.ParseRowsFast([]byte(body), testMaxRows); ok {
			t.Errorf("scanner took %q: %#v", body, rows)
		}
		sameResult(t, []byte(body))
	}
}

// The slices the scanner returns are as encoding/json's path returns
// them, which reflect.DeepEqual in the tests above checks, and said here
// outright: no puts (absent, null or []) is nil puts; absent or null
// deletes are nil, [] is empty; an empty value is empty, not nil.
func TestParseRowsFastSlices(t *testing.T) {
	body := []byte(`{"rows":[{"target":"a","puts":[],"deletes":[]},{"target":"b","puts":null,"deletes":null},{"target":"c","puts":[{"key":"k","value":""}]}]}`)
	rows, ok := api.ParseRowsFast(body, testMaxRows)
	if !ok {
		t.Fatal("scanner declined")
	}
	if rows[0].Puts != nil || rows[0].Deletes == nil || len(rows[0].Deletes) != 0 {
		t.Errorf("puts:[], deletes:[] read as %#v", rows[0])
	}
	if rows[1].Puts != nil || rows[1].Deletes != nil {
		t.Errorf("null puts and deletes read as %#v", rows[1])
	}
	if rows[2].Deletes != nil || rows[2].Puts[0].Value == nil || len(rows[2].Puts[0].Value) != 0 {
		t.Errorf(`value "" and no deletes read as %#v`, rows[2])
	}
}

// The rows share the scanner's buffers but no bytes: not with the body,
// which the caller may reuse, and not with each other, whatever a later
// append or write does to one.
func TestParseRowsFastNoAliasing(t *testing.T) {
	body := []byte(`{"rows":[{"target":"t","puts":[{"key":"a","value":"AAE="},{"key":"b","value":"AgM="}],"deletes":["x"]},{"target":"u","puts":[{"key":"c","value":"BAU="}],"deletes":["y"]}]}`)
	rows, ok := api.ParseRowsFast(body, testMaxRows)
	if !ok {
		t.Fatal("scanner declined")
	}
	want, _ := api.ParseRowsJSON(body, testMaxRows)
	for i := range body {
		body[i] = 'z'
	}
	_ = append(rows[0].Puts[0].Value, 9, 9)
	_ = append(rows[0].Puts, relaycore.KV{Key: "n"})
	_ = append(rows[0].Deletes, "n")
	rows[0].Puts[1].Value[0] = 7
	want[0].Puts[1].Value[0] = 7
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("after writes to the body and to row 0's slices:\n%#v\nwant %#v", rows, want)
	}
}

func FuzzParseRows(f *testing.F) {
	for _, body := range append(append([]string{}, fastBodies...), declinedBodies...) {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The scanner takes only what encoding/json's path takes, and
		// reads it the same.
		if rows, ok := api.ParseRowsFast(body, testMaxRows); ok {
			want, err := api.ParseRowsJSON(body, testMaxRows)
			if err != nil || !reflect.DeepEqual(rows, want) {
				t.Fatalf("body %q:\nscanner       %#v\nencoding/json %#v, %v", body, rows, want, err)
			}
		}
		sameResult(t, body)
		rows, err := api.ParseRows(body, testMaxRows)
		if err != nil {
			return
		}
		if len(rows) == 0 || len(rows) > testMaxRows {
			t.Fatalf("accepted %d rows", len(rows))
		}
		for i, r := range rows {
			if r.Target == "" || strings.HasPrefix(string(r.Target), relaycore.ReservedPrefix) {
				t.Fatalf("row %d: accepted target %q", i, r.Target)
			}
		}
	})
}

// FuzzParseRowsShape fuzzes the parts of a body of the scanner's shape
// rather than its bytes, so most inputs are bodies it may take: strings
// put between quotes as they are (quotes, backslashes, control bytes and
// invalid UTF-8 included), whitespace between every two tokens, values
// base64 or not, members in either order, puts and deletes given, empty,
// null or absent, one or two rows. The checks are FuzzParseRows'.
func FuzzParseRowsShape(f *testing.F) {
	f.Add("customer-42", "order/1", []byte(`{"total":1}`), "cart/1", "", uint16(0))
	f.Add("t", "k", []byte{}, "", " \n", uint16(0x1ff))
	f.Add("café", "ключ", []byte{0xff, 0}, "ü", "\t", uint16(0x0a5))
	f.Add(`t\"`, `k\u0041`, []byte("x"), "\n", "\r\n ", uint16(0x15a))
	f.Fuzz(func(t *testing.T, target, key string, value []byte, del, ws string, flags uint16) {
		v := base64.StdEncoding.EncodeToString(value)
		if flags&0x100 != 0 {
			v = string(value)
		}
		w := func(tokens ...string) string { return ws + strings.Join(tokens, ws) + ws }
		put := w("{", `"key"`, ":", `"`+key+`"`, ",", `"value"`, ":", `"`+v+`"`, "}")
		if flags&0x80 != 0 {
			put = w("{", `"value"`, ":", `"`+v+`"`, ",", `"key"`, ":", `"`+key+`"`, "}")
		}
		arrays := map[uint16]string{0: "[" + put + "]", 1: "[" + put + "," + put + "]", 2: "[]", 3: "null"}
		dels := map[uint16]string{0: w("[", `"`+del+`"`, "]"), 1: w("[", `"`+del+`"`, ",", `"`+key+`"`, "]"), 2: "[]", 3: "null"}
		members := []string{w(`"target"`, ":", `"`+target+`"`)}
		if flags&4 == 0 {
			members = append(members, w(`"puts"`, ":", arrays[flags&3]))
		}
		if flags&0x20 == 0 {
			members = append(members, w(`"deletes"`, ":", dels[flags>>3&3]))
		}
		if flags&0x40 != 0 {
			slices.Reverse(members)
		}
		row := w("{", strings.Join(members, ","), "}")
		rows := row
		if flags&0x200 != 0 {
			rows += "," + row
		}
		body := []byte(w("{", `"rows"`, ":", "[", rows, "]", "}"))
		if rows, ok := api.ParseRowsFast(body, testMaxRows); ok {
			want, err := api.ParseRowsJSON(body, testMaxRows)
			if err != nil || !reflect.DeepEqual(rows, want) {
				t.Fatalf("body %q:\nscanner       %#v\nencoding/json %#v, %v", body, rows, want, err)
			}
		}
		sameResult(t, body)
	})
}

// BenchmarkParseRows: decoding a 100-row enqueue body (200-byte values,
// 8 targets, as bench's serve load sends) by ParseRows, against
// encoding/json's path (parseRowsJSON, ParseRows before the scanner)
// timed on the same body in the same iterations; allocations counted for
// each (machine-independent). It fails if the scanner declines the body.
func BenchmarkParseRows(b *testing.B) {
	const n = 100
	body := rowsBody(n, 200)
	if _, ok := api.ParseRowsFast(body, n); !ok {
		b.Fatal("the scanner declined the body")
	}
	paths := []func([]byte, int) ([]relaycore.Row, error){api.ParseRowsJSON, api.ParseRows}
	var took [2]time.Duration
	iters := 0
	for b.Loop() {
		for k, parse := range paths {
			start := time.Now()
			if _, err := parse(body, n); err != nil {
				b.Fatal(err)
			}
			took[k] += time.Since(start)
		}
		iters++
	}
	perRow := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(iters*n) }
	b.ReportMetric(perRow(took[0]), "json-ns/row")
	b.ReportMetric(perRow(took[1]), "ns/row")
	b.ReportMetric(float64(took[1])/float64(took[0]), "ns-vs-json")
	for k, name := range []string{"json-allocs/row", "allocs/row"} {
		allocs := testing.AllocsPerRun(20, func() { _, _ = paths[k](body, n) })
		b.ReportMetric(allocs/n, name)
	}
}

// A field name in another case and a repeated field are refused:
// encoding/json alone reads them (the name without case, the last of the
// repeats), so {"target":"customer-42","TARGET":"customer-7"} relayed to
// customer-7.
func TestParseRowsRefusesCaseAndRepeats(t *testing.T) {
	for _, body := range []string{
		`{"Rows":[{"target":"t","deletes":["k"]}]}`,
		`{"rows":[{"target":"customer-42","puts":[{"key":"k1","value":""}],"TARGET":"customer-7"}]}`,
		`{"rows":[{"target":"t","puts":[{"key":"k","VALUE":""}]}]}`,
		`{"rows":[{"target":"t","target":"u","deletes":["k"]}]}`,
		`{"rows":[{"target":"t","deletes":["k"]}],"rows":[{"target":"u","deletes":["j"]}]}`,
	} {
		_, err := api.ParseRows([]byte(body), testMaxRows)
		if err == nil || !(strings.Contains(err.Error(), "case-sensitive") || strings.Contains(err.Error(), "appears twice")) {
			t.Errorf("%s: %v; want refused for the name's case or the repeat", body, err)
		}
	}
}
