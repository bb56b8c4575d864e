package wire

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// versionPair is v2Pair at another version.
func versionPair(t *testing.T, version int) (snd, rcv *Conn) {
	t.Helper()
	snd, rcv = tcpPair(t, Options{Version: version, Window: 4})
	ctx := context.Background()
	errs := goAsync(func() error { return rcv.SendHello(ctx, "receiver") })
	if err := snd.SendHello(ctx, "sender"); err != nil {
		t.Fatal(err)
	}
	if _, err := snd.RecvHello(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvHello(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return snd, rcv
}

// TestWant: on a version 3 connection a WANT reaches the receiver as
// Request.Want and its HOLDS is matched as a QUERY's is (only entries of
// exactly the wanted size and digest count; naming one not wanted is
// ErrAckMismatch). Version 2 has no WANT: Want refuses to send it, and a
// receiver refuses one as an unexpected frame, so a version 2 peer never
// sees it.
func TestWant(t *testing.T) {
	ctx := context.Background()
	snd, rcv := versionPair(t, Version3)
	a, b := offerFor("a", []byte("A")), offerFor("b", []byte("B"))
	otherB := b
	otherB.SHA256 = offerFor("x", []byte("other")).SHA256
	errs := goAsync(func() error {
		req, err := rcv.RecvRequest(ctx)
		if err != nil {
			return err
		}
		if len(req.Want) != 2 || req.Query != nil || req.Segment {
			return fmt.Errorf("request %+v, want a WANT of 2", req)
		}
		return rcv.SendHolds(ctx, []Offer{a, otherB})
	})
	granted, mismatched, err := snd.Want(ctx, []Offer{a, b})
	if err != nil || len(granted) != 1 || granted[0] != a || mismatched != 1 {
		t.Fatalf("Want = %+v, %d mismatched, %v; want only a", granted, mismatched, err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	errs = goAsync(func() error {
		if _, err := rcv.RecvRequest(ctx); err != nil {
			return err
		}
		return rcv.SendHolds(ctx, []Offer{offerFor("z", nil)})
	})
	if _, _, err := snd.Want(ctx, []Offer{a}); !errors.Is(err, ErrAckMismatch) {
		t.Fatalf("HOLDS naming an unwanted segment: %v, want ErrAckMismatch", err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}

	snd2, rcv2 := versionPair(t, Version2)
	if _, _, err := snd2.Want(ctx, []Offer{a}); !errors.Is(err, ErrVersion) {
		t.Fatalf("Want on version 2: %v, want ErrVersion", err)
	}
	p, _ := EncodeSegments([]Offer{a})
	if err := snd2.sendControl(ctx, "want", TypeWant, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv2.RecvRequest(ctx); !errors.Is(err, ErrUnexpectedFrame) {
		t.Fatalf("WANT on version 2: %v, want ErrUnexpectedFrame", err)
	}
}
