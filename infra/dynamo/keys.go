package dynamo

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

// Keys and partition names are arbitrary byte strings in the contract, but
// a DynamoDB string must be valid UTF-8, and the sort order of S keys is
// their UTF-8 byte order. encodeKey maps each byte to one code point
// (ISO-8859-1 read as Unicode) and writes it as UTF-8: bytes below 0x80
// stay as they are, bytes 0x80..0xFF become two bytes C2/C3 xx. The codes
// are prefix-free and increase with the byte, so the encoding preserves
// byte order and round-trips every string. ASCII keys (all engine keys)
// are stored unchanged; a non-ASCII UTF-8 key such as "é" appears as "Ã©"
// and is recovered by encoding the attribute back to ISO-8859-1.
//
// An identity mapping for valid UTF-8 is impossible here: valid UTF-8
// strings are dense in byte order, so no place is left for the keys that
// are not UTF-8 (storetest's 0xff keys) without renaming some valid ones.

// maxSortKeyBytes is DynamoDB's limit on a sort key value (1024 bytes,
// after encoding).
const maxSortKeyBytes = 1024

// errKeyTooLong is wrapped in ErrInvalidBatch for keys DynamoDB would
// refuse.
var errKeyTooLong = errors.New("key exceeds DynamoDB's 1024-byte sort key limit once encoded")

func encodeKey(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < utf8.RuneSelf {
			b = append(b, c)
			continue
		}
		b = append(b, 0xC0|c>>6, 0x80|c&0x3F)
	}
	return string(b)
}

func encodedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			n++
		}
	}
	return n
}

func decodeKey(s string) (string, error) {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i, r := range s {
		// U+FFFD (an invalid sequence) is above 0xFF too.
		if r > 0xFF {
			return "", fmt.Errorf("key %q is not an encoded relay key (code point %U at byte %d)", s, r, i)
		}
		b = append(b, byte(r))
	}
	return string(b), nil
}

// checkKeyLen refuses a key whose encoding DynamoDB would reject.
func checkKeyLen(key string) error {
	if encodedLen(key) > maxSortKeyBytes {
		return fmt.Errorf("%w: %w: %d bytes encoded", relaycore.ErrInvalidBatch, errKeyTooLong, encodedLen(key))
	}
	return nil
}

func keyOf(p relaycore.Partition, key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		AttrPartition: &types.AttributeValueMemberS{Value: encodeKey(string(p))},
		AttrKey:       &types.AttributeValueMemberS{Value: encodeKey(key)},
	}
}

// keyAttr decodes the partition or key attribute name of item.
func keyAttr(item map[string]types.AttributeValue, name string) (string, error) {
	s, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return "", fmt.Errorf("attribute %q missing or not S", name)
	}
	return decodeKey(s.Value)
}
