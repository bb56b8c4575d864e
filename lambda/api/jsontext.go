package api

import (
	"unicode/utf8"

	"github.com/relay-dev/relay/internal/strictjson"
)

// jsonTextProblem refuses a JSON body that encoding/json would read with
// U+FFFD in place of what it says: bytes that are not UTF-8, and a \u
// escape of half a UTF-16 surrogate pair ("t\ud800"), which encoding/json
// also decodes to U+FFFD without an error. Either would relay to a target
// (or write a key, or take down a content id) the client never named.
func jsonTextProblem(body []byte) *apiError {
	if !utf8.Valid(body) {
		return fail(400, "bad_request", "body: not valid UTF-8, which JSON text must be (a target name or key of other bytes cannot travel in a JSON string)")
	}
	if at := strictjson.LoneSurrogate(body); at >= 0 {
		return fail(400, "bad_request", "body: %s at byte %d is half of a UTF-16 surrogate pair, which stands for no character (JSON would read it as U+FFFD)", body[at:at+6], at)
	}
	return nil
}
