package wire

import (
	"errors"
	"strings"
	"testing"
)

const digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" // sha256("")

func TestCheckSegmentID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"seg-0001.part_2", true},
		{"_x", true},
		{"0", true},
		{strings.Repeat("a", MaxSegmentIDLen), true},
		{"", false},
		{strings.Repeat("a", MaxSegmentIDLen+1), false},
		{".", false},
		{"..", false},
		{".hidden", false},
		{"-flag", false},
		{"a/b", false},
		{"a\\b", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
		{"a:b", false},
	} {
		err := CheckSegmentID(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("CheckSegmentID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidID) {
			t.Errorf("CheckSegmentID(%q) = %v, want ErrInvalidID", tc.id, err)
		}
	}
	if CheckNodeID(strings.Repeat("n", MaxNodeIDLen+1)) == nil {
		t.Error("node id longer than MaxNodeIDLen accepted")
	}
}

func TestDecodeOffer(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Offer
		err      string // substring; "" means success
	}{
		{"ok", `{"segment_id":"s1","size":0,"sha256":"` + digest + `"}`, Offer{"s1", 0, digest}, ""},
		{"ok any order and spaces", ` { "sha256" : "` + digest + `", "size": 4294967295, "segment_id":"s1" } `, Offer{"s1", 1<<32 - 1, digest}, ""},
		{"empty", ``, Offer{}, "not a JSON object"},
		{"array", `[]`, Offer{}, "not a JSON object"},
		{"string", `"x"`, Offer{}, "not a JSON object"},
		{"unknown key", `{"segment_id":"s1","size":0,"sha256":"` + digest + `","extra":1}`, Offer{}, `unknown key "extra"`},
		{"key case differs", `{"Segment_ID":"s1","size":0,"sha256":"` + digest + `"}`, Offer{}, `unknown key "Segment_ID"`},
		{"duplicate key", `{"segment_id":"s1","segment_id":"s2","size":0,"sha256":"` + digest + `"}`, Offer{}, `duplicate key "segment_id"`},
		{"missing size", `{"segment_id":"s1","sha256":"` + digest + `"}`, Offer{}, `missing key "size"`},
		{"null size", `{"segment_id":"s1","size":null,"sha256":"` + digest + `"}`, Offer{}, `"size" is null`},
		{"negative size", `{"segment_id":"s1","size":-1,"sha256":"` + digest + `"}`, Offer{}, "size -1"},
		{"size too large", `{"segment_id":"s1","size":4294967296,"sha256":"` + digest + `"}`, Offer{}, "size 4294967296"},
		{"fractional size", `{"segment_id":"s1","size":1.5,"sha256":"` + digest + `"}`, Offer{}, `key "size"`},
		{"exponent size", `{"segment_id":"s1","size":1e3,"sha256":"` + digest + `"}`, Offer{}, `key "size"`},
		{"string size", `{"segment_id":"s1","size":"1","sha256":"` + digest + `"}`, Offer{}, `key "size"`},
		{"bad id", `{"segment_id":"../etc","size":0,"sha256":"` + digest + `"}`, Offer{}, "segment id"},
		{"empty id", `{"segment_id":"","size":0,"sha256":"` + digest + `"}`, Offer{}, "segment id"},
		{"upper hex", `{"segment_id":"s1","size":0,"sha256":"` + strings.ToUpper(digest) + `"}`, Offer{}, "lowercase hex"},
		{"short hex", `{"segment_id":"s1","size":0,"sha256":"abcd"}`, Offer{}, "64 lowercase hex"},
		{"trailing data", `{"segment_id":"s1","size":0,"sha256":"` + digest + `"}{}`, Offer{}, "data after"},
		{"unterminated", `{"segment_id":"s1","size":0`, Offer{}, "unterminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeOffer([]byte(tc.in))
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("DecodeOffer = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("DecodeOffer error = %v; want ErrBadMessage containing %q", err, tc.err)
			}
		})
	}
}

func TestDecodeHello(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Hello
		err      string
	}{
		{"ok", `{"version":1,"node_id":"node-a"}`, Hello{Version: 1, NodeID: "node-a"}, ""},
		{"v2 with window", `{"version":2,"node_id":"n","window":64}`, Hello{Version: 2, NodeID: "n", Window: 64}, ""},
		{"future version decodes", `{"version":7,"node_id":"n","window":1}`, Hello{Version: 7, NodeID: "n", Window: 1}, ""},
		{"v1 with window", `{"version":1,"node_id":"n","window":4}`, Hello{}, "window 4 in a version 1"},
		{"v1 with window 0", `{"version":1,"node_id":"n","window":0}`, Hello{}, "window 0 in a version 1"},
		{"v2 without window", `{"version":2,"node_id":"n"}`, Hello{}, "window 0 outside"},
		{"v2 window 0", `{"version":2,"node_id":"n","window":0}`, Hello{}, "window 0 in a version 2"},
		{"v2 window too large", `{"version":2,"node_id":"n","window":4097}`, Hello{}, "window 4097 outside"},
		{"v2 window negative", `{"version":2,"node_id":"n","window":-1}`, Hello{}, "window -1 outside"},
		{"v2 window string", `{"version":2,"node_id":"n","window":"4"}`, Hello{}, `key "window"`},
		{"zero version", `{"version":0,"node_id":"n"}`, Hello{}, "version 0"},
		{"missing node", `{"version":1}`, Hello{}, `missing key "node_id"`},
		{"bad node", `{"version":1,"node_id":"a b"}`, Hello{}, "node id"},
		{"unknown", `{"version":1,"node_id":"n","x":true}`, Hello{}, `unknown key "x"`},
		{"version string", `{"version":"1","node_id":"n"}`, Hello{}, `key "version"`},
		{"null id", `{"version":1,"node_id":null}`, Hello{}, "is null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeHello([]byte(tc.in))
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("DecodeHello = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("DecodeHello error = %v; want ErrBadMessage containing %q", err, tc.err)
			}
		})
	}
}

func TestDecodeNack(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Nack
		err      string
	}{
		{"ok", `{"segment_id":"s","code":"quota","message":"full"}`, Nack{"s", NackQuota, "full"}, ""},
		{"message omitted", `{"segment_id":"s","code":"checksum"}`, Nack{"s", NackChecksum, ""}, ""},
		{"empty id for bad offer", `{"segment_id":"","code":"bad_request","message":"x"}`, Nack{"", NackBadRequest, "x"}, ""},
		{"every code too_large", `{"segment_id":"s","code":"too_large"}`, Nack{"s", NackTooLarge, ""}, ""},
		{"every code internal", `{"segment_id":"s","code":"internal"}`, Nack{"s", NackInternal, ""}, ""},
		{"unknown code", `{"segment_id":"s","code":"nope"}`, Nack{}, `unknown nack code "nope"`},
		{"code case", `{"segment_id":"s","code":"QUOTA"}`, Nack{}, "unknown nack code"},
		{"missing code", `{"segment_id":"s"}`, Nack{}, `missing key "code"`},
		{"missing id", `{"code":"quota"}`, Nack{}, `missing key "segment_id"`},
		{"long message", `{"segment_id":"s","code":"quota","message":"` + strings.Repeat("m", MaxNackMessage+1) + `"}`, Nack{}, "exceeds"},
		{"bad id", `{"segment_id":".x","code":"quota"}`, Nack{}, "segment id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeNack([]byte(tc.in))
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("DecodeNack = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("DecodeNack error = %v; want ErrBadMessage containing %q", err, tc.err)
			}
		})
	}
}

func TestDecodeAck(t *testing.T) {
	if id, err := DecodeAck([]byte("seg-1")); err != nil || id != "seg-1" {
		t.Fatalf("DecodeAck = %q, %v", id, err)
	}
	for _, in := range []string{"", `"seg-1"`, "seg 1", ".."} {
		if _, err := DecodeAck([]byte(in)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("DecodeAck(%q) = %v, want ErrBadMessage", in, err)
		}
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	for name, err := range map[string]error{
		"hello": func() error { _, err := EncodeHello(Hello{Version: 1, NodeID: ""}); return err }(),
		"offer": func() error { _, err := EncodeOffer(Offer{SegmentID: "s", Size: -1, SHA256: digest}); return err }(),
		"nack":  func() error { _, err := EncodeNack(Nack{SegmentID: "s", Code: "maybe"}); return err }(),
	} {
		if !errors.Is(err, ErrBadMessage) {
			t.Errorf("encode %s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

// TestEncodeIsCanonical pins the exact bytes: key order as documented and
// no HTML escaping, so other implementations can compare payloads.
func TestEncodeIsCanonical(t *testing.T) {
	p, err := EncodeNack(Nack{SegmentID: "s", Code: NackInternal, Message: "a<b & c>d"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"segment_id":"s","code":"internal","message":"a<b & c>d"}`; string(p) != want {
		t.Fatalf("EncodeNack = %s, want %s", p, want)
	}
}

func TestTruncateMessage(t *testing.T) {
	s := strings.Repeat("é", MaxNackMessage) // 2 bytes per rune
	got := TruncateMessage(s)
	if len(got) > MaxNackMessage || !strings.HasPrefix(s, got) || len(got) < MaxNackMessage-1 {
		t.Fatalf("TruncateMessage: %d bytes", len(got))
	}
	if _, err := EncodeNack(Nack{SegmentID: "s", Code: NackQuota, Message: got}); err != nil {
		t.Fatalf("truncated message refused: %v", err)
	}
	// The worst case for escaping still fits a control frame.
	p, err := EncodeNack(Nack{SegmentID: strings.Repeat("s", MaxSegmentIDLen), Code: NackBadRequest, Message: strings.Repeat("\x01", MaxNackMessage)})
	if err != nil || len(p) > MaxControlPayload {
		t.Fatalf("worst-case NACK: %d bytes, %v; limit %d", len(p), err, MaxControlPayload)
	}
}

// TestTruncatedMessageSurvivesTheWire: SendNack promises that any error
// text can be sent. JSON encodes each invalid UTF-8 byte as U+FFFD, three
// bytes once decoded, so a message of at most MaxNackMessage bytes could
// decode to more and the sender refused the whole NACK (ErrBadMessage),
// losing its code: TruncateMessage must yield text that round-trips.
func TestTruncatedMessageSurvivesTheWire(t *testing.T) {
	for _, msg := range []string{
		strings.Repeat("\xff", MaxNackMessage),
		strings.Repeat("\xff", 3*MaxNackMessage),
		"open /var/lib/edged/\xc3(: permission denied",
		strings.Repeat("é", MaxNackMessage) + "\xff",
	} {
		n := Nack{SegmentID: "s", Code: NackQuota, Message: TruncateMessage(msg)}
		p, err := EncodeNack(n)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		got, err := DecodeNack(p)
		if err != nil {
			t.Fatalf("NACK with message from %q... does not decode: %v", msg[:min(len(msg), 16)], err)
		}
		if got.Code != NackQuota || got.Message != n.Message {
			t.Fatalf("round trip changed the NACK: %+v", got)
		}
	}
}
