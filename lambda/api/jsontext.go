package api

import (
	"strconv"
	"unicode/utf8"
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
	if at := loneSurrogate(body); at >= 0 {
		return fail(400, "bad_request", "body: %s at byte %d is half of a UTF-16 surrogate pair, which stands for no character (JSON would read it as U+FFFD)", body[at:at+6], at)
	}
	return nil
}

// loneSurrogate returns the offset of the first \u escape in body that is
// a surrogate without its other half, or -1. A backslash occurs only in
// strings of valid JSON, each one escape; malformed escapes are left to
// the decoder.
func loneSurrogate(body []byte) int {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		r, ok := escapedUnit(body, i)
		switch {
		case !ok:
			i++ // another escape: skip its character
		case r >= 0xd800 && r < 0xdc00:
			if lo, ok := escapedUnit(body, i+6); !ok || lo < 0xdc00 || lo >= 0xe000 {
				return i
			}
			i += 11
		case r >= 0xdc00 && r < 0xe000:
			return i
		default:
			i += 5
		}
	}
	return -1
}

// escapedUnit reads a \uXXXX escape at body[i:].
func escapedUnit(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
	return rune(v), err == nil
}
