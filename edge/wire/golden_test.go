package wire

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/frames from the encoders")

// goldenFrames are real frames of every type, written by the encoders. They
// pin the wire format (a change to an encoder that alters bytes fails
// TestGoldenFrames) and seed the fuzz tests.
func goldenFrames(t testing.TB) map[string][]byte {
	t.Helper()
	must := func(p []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	frame := func(typ Type, p []byte) []byte { return AppendFrame(nil, typ, p) }
	var seg bytes.Buffer
	if err := WriteSegment(&seg, 5, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	const helloSum = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" // sha256("hello")
	return map[string][]byte{
		"hello.frame":           frame(TypeHello, must(EncodeHello(Hello{Version: Version1, NodeID: "node-a"}))),
		"hello-v2.frame":        frame(TypeHello, must(EncodeHello(Hello{Version: Version2, NodeID: "node-a", Window: 256}))),
		"accept.frame":          frame(TypeAccept, []byte("seg-0001")),
		"query.frame":           frame(TypeQuery, must(EncodeSegments([]Offer{{SegmentID: "seg-0001", Size: 5, SHA256: helloSum}, {SegmentID: "empty.bin", Size: 0, SHA256: digest}}))),
		"want.frame":            frame(TypeWant, must(EncodeSegments([]Offer{{SegmentID: "seg-0001", Size: 5, SHA256: helloSum}}))),
		"hello-v3.frame":        frame(TypeHello, must(EncodeHello(Hello{Version: Version3, NodeID: "node-a", Window: 256}))),
		"hello-v4.frame":        frame(TypeHello, must(EncodeHello(Hello{Version: Version4, NodeID: "node-a", Window: 256}))),
		"holds.frame":           frame(TypeHolds, must(EncodeSegments([]Offer{{SegmentID: "seg-0001", Size: 5, SHA256: helloSum}}))),
		"offer.frame":           frame(TypeOffer, must(EncodeOffer(Offer{SegmentID: "seg-0001", Size: 5, SHA256: helloSum}))),
		"offer-empty.frame":     frame(TypeOffer, must(EncodeOffer(Offer{SegmentID: "empty.bin", Size: 0, SHA256: digest}))),
		"push.frame":            frame(TypePush, must(EncodeOffer(Offer{SegmentID: "seg-0001", Size: 5, SHA256: helloSum}))),
		"segment.frame":         seg.Bytes(),
		"ack.frame":             frame(TypeAck, []byte("seg-0001")),
		"nack-quota.frame":      frame(TypeNack, must(EncodeNack(Nack{SegmentID: "seg-0001", Code: NackQuota, Message: "quota: 10 of 10 segments held"}))),
		"nack-badrequest.frame": frame(TypeNack, must(EncodeNack(Nack{Code: NackBadRequest, Message: "decode offer: bad message"}))),
		"nack-evicted.frame":    frame(TypeNack, must(EncodeNack(Nack{SegmentID: "seg-0001", Code: NackEvicted, Message: "segment evicted for takedown request req-1; it is not accepted again"}))),
	}
}

func TestGoldenFrames(t *testing.T) {
	dir := filepath.Join("testdata", "frames")
	for name, want := range goldenFrames(t) {
		path := filepath.Join(dir, name)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestGoldenFrames -update to create)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoders now produce\n%q\nbut the committed frame is\n%q\n(a wire format change: update docs/wire.md, then -update)", name, want, got)
		}
	}
}

// seedFrames adds every committed frame (whole, and split into header and
// payload) to a fuzz corpus.
func seedFrames(f *testing.F, payloadsOnly bool) {
	paths, err := filepath.Glob(filepath.Join("testdata", "frames", "*.frame"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no seed frames in testdata/frames: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if payloadsOnly {
			f.Add(b[HeaderLen:])
		} else {
			f.Add(b)
		}
	}
}
