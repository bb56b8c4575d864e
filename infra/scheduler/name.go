package scheduler

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/relay-dev/relay/relaycore"
)

// Scheduler's rules for schedule names: 1 to 64 characters from
// [0-9a-zA-Z-_.].
const (
	maxNameLen = 64
	// hashLen hex digits (64 bits) of SHA-256 over the exact source id keep
	// distinct sources apart even when sanitizing maps them to the same
	// readable prefix. A collision needs ~2^32 sources to become likely.
	hashLen = 16
	// maxPrefixLen leaves room for "-" + hash + "-" + a 20-character int64.
	maxPrefixLen = maxNameLen - 1 - hashLen - 1 - 20
)

// ScheduleName is the deterministic schedule name for the alarm of source
// due at unix second dueSec: a readable prefix of the source id (characters
// outside Scheduler's alphabet replaced by '_'), a hash of the exact source
// id, and the due second. Distinct (source, dueSec) pairs get distinct names
// (up to a 64-bit hash collision); the same pair always gets the same name,
// which is what makes duplicate kicks collapse.
func ScheduleName(source relaycore.Partition, dueSec int64) string {
	sum := sha256.Sum256([]byte(source))
	var b strings.Builder
	b.Grow(maxNameLen)
	for i := 0; i < len(source) && b.Len() < maxPrefixLen; i++ {
		c := source[i]
		if allowedNameByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("src")
	}
	b.WriteByte('-')
	b.WriteString(hex.EncodeToString(sum[:hashLen/2]))
	b.WriteByte('-')
	b.WriteString(strconv.FormatInt(dueSec, 10))
	return b.String()
}

// ValidName reports whether s satisfies Scheduler's name rules.
func ValidName(s string) bool {
	if len(s) < 1 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !allowedNameByte(s[i]) {
			return false
		}
	}
	return true
}

func allowedNameByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
		c == '-' || c == '_' || c == '.'
}
