package strictjson

import (
	"encoding/json"
	"strings"
	"testing"
)

type put struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type row struct {
	Target  string   `json:"target"`
	Puts    []put    `json:"puts"`
	Deletes []string `json:"deletes"`
}

type inner struct {
	By string `json:"by"`
}

type request struct {
	Rows []row `json:"rows"`
	inner
	Labels map[string]string `json:"labels"`
	Raw    json.RawMessage   `json:"raw"`
}

// Each refused body is one encoding/json takes without an error (with
// DisallowUnknownFields), reading something the client did not mean.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"rows":[{"target":"a","puts":[{"key":"k","value":""}]}],"by":"x","labels":{"A":"1","a":"2"},"raw":{"Any":1,"any":2}}`, ""},
		{`{"Rows":[]}`, `unknown field "Rows" (field names are case-sensitive: "rows")`},
		{`{"rows":[{"target":"a","TARGET":"b"}]}`, `unknown field "TARGET"`},
		{`{"rows":[{"target":"a","puts":[{"key":"k","KEY":"j"}]}]}`, `unknown field "KEY"`},
		{`{"rows":[{"target":"a","target":"b"}]}`, `field "target" appears twice`},
		{`{"by":"x","By":"y"}`, `unknown field "By"`},
		{`{"labels":{"a":"1","a":"2"}}`, `field "a" appears twice`},
		{`{"rows":[{"target":"a","deletes":["k"]}]} trailing`, ""}, // the decoder's to refuse
		{`{"rows":[{"target":`, ""}, // syntax: the decoder's
		{`{"unknown":1}`, ""},       // DisallowUnknownFields' to refuse
		{`{"rows":[{"target":"t\ud800"}]}`, "half of a UTF-16 surrogate pair"},
		{`{"rows":[{"target":"t\udc00"}]}`, "half of a UTF-16 surrogate pair"},
		{`{"rows":[{"target":"t\ud800\u0041"}]}`, "half of a UTF-16 surrogate pair"},
		{`{"rows":[{"target":"t\ud83d\ude00"}]}`, ""}, // a whole pair
		{`{"rows":[{"target":"t\\ud800"}]}`, ""},      // an escaped backslash, then text
		{"{\"rows\":[{\"target\":\"t\xff\"}]}", "not valid UTF-8"},
	} {
		err := Check([]byte(tc.body), &request{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.body, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.body, err, tc.want)
		}
	}
}
