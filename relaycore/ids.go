package relaycore

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The rule for ids, stated once here and applied by every host: the
// engine's enqueue (targets), lambda/api's routes and bodies, relay
// serve's routes and configuration, and the relay CLI, which calls the
// API handler.
//
// A source id is 1..MaxPartitionLen bytes of valid UTF-8 without control
// characters, not starting with ReservedPrefix: it is text wherever it
// goes (log lines, metric labels, the API's JSON, DynamoDB table keys
// written by the sweep). A target name is 1..MaxPartitionLen bytes, any
// bytes, not starting with ReservedPrefix: the layout carries it as hex
// in keys and base64url in records where JSON could not hold it
// (docs/layout.md), so a Go program may relay to a binary name. In a URL
// path a name is percent-encoded, so any bytes reach the routes; inside a
// JSON string (an enqueue body) it is whatever a JSON string can be,
// valid UTF-8.

// SourceIDProblem says what is wrong with s as a source id ("is not
// valid UTF-8"), or "" when nothing is.
func SourceIDProblem(s string) string {
	if reason := partitionNameProblem(s); reason != "" {
		return reason
	}
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.ContainsFunc(s, unicode.IsControl):
		return "contains a control character"
	}
	return ""
}

// TargetNameProblem says what is wrong with t as a target name, or ""
// when nothing is: any bytes will do within the length, outside the
// reserved prefix.
func TargetNameProblem(t string) string {
	return partitionNameProblem(t)
}

// TargetNameHex is t's bytes in lowercase hex when they are not valid
// UTF-8, and "" when they are: what the API answers beside a name that
// JSON cannot show exactly (as target_hex; docs/api.md).
func TargetNameHex(t Partition) string {
	if utf8.ValidString(string(t)) {
		return ""
	}
	return targetHex(t)
}

func partitionNameProblem(s string) string {
	switch {
	case s == "":
		return "is missing or empty"
	case len(s) > MaxPartitionLen:
		return fmt.Sprintf("is %d bytes, limit %d", len(s), MaxPartitionLen)
	case strings.HasPrefix(s, ReservedPrefix):
		return fmt.Sprintf("uses the reserved prefix %q", ReservedPrefix)
	}
	return ""
}
