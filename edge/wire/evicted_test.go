package wire

import (
	"errors"
	"testing"
)

// NACK evicted is version 4's: an older peer refuses a NACK with a code it
// does not know as a malformed message, so it is told bad_request.
func TestNackForVersion(t *testing.T) {
	for _, tc := range []struct {
		code    NackCode
		version int
		want    NackCode
	}{
		{NackEvicted, Version4, NackEvicted},
		{NackEvicted, Version3, NackBadRequest},
		{NackEvicted, Version2, NackBadRequest},
		{NackEvicted, Version1, NackBadRequest},
		{NackQuota, Version1, NackQuota},
		// busy is version 5's; older peers are told quota, which they
		// postpone without spending the retry budget.
		{NackBusy, Version5, NackBusy},
		{NackBusy, Version4, NackQuota},
		{NackBusy, Version2, NackQuota},
		{NackBusy, Version1, NackQuota},
	} {
		if got := NackFor(tc.code, tc.version); got != tc.want {
			t.Errorf("NackFor(%s, %d) = %s, want %s", tc.code, tc.version, got, tc.want)
		}
	}
	p, err := EncodeNack(Nack{SegmentID: "s", Code: NackEvicted})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := DecodeNack(p); err != nil || n.Code != NackEvicted {
		t.Fatalf("decode: %+v %v", n, err)
	}
	if n, err := DecodeNack([]byte(`{"segment_id":"s","code":"busy","message":""}`)); err != nil || n.Code != NackBusy {
		t.Fatalf("decode busy: %+v %v", n, err)
	}
	if _, err := DecodeNack([]byte(`{"segment_id":"s","code":"gone","message":""}`)); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("unknown code: %v", err)
	}
}
