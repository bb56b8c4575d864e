package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

// pushItem is item with Push set.
func pushItem(id string, data []byte) Item {
	it := item(id, data)
	it.Push = true
	return it
}

// TestDeliverPush: pushed items go out as PUSH with their SEGMENT right
// behind, no ACCEPT asked or allowed; the receiver answers each with a
// final reply only (ACK stored, ACK already held, NACK refused), all
// matched by id, while a large item marked Push is offered as usual and
// pushed and offered items share the window.
func TestDeliverPush(t *testing.T) {
	ctx := context.Background()
	const window = 4
	snd, rcv := v2Pair(t, window)
	items := []Item{
		pushItem("p0", []byte("zero")),
		pushItem("held", []byte("held content")),
		pushItem("refused", []byte("no room")),
		item("offered", []byte("offered content")),
		pushItem("big", bytes.Repeat([]byte{7}, MaxPushSize+1)),
		pushItem("empty", nil),
		pushItem("max", bytes.Repeat([]byte{9}, MaxPushSize)),
	}
	for i := range 6 {
		items = append(items, pushItem(fmt.Sprintf("q%d", i), bytes.Repeat([]byte{byte(i)}, 100*i)))
	}
	type event struct {
		id     string
		pushed bool
		data   []byte
	}
	events := make(chan []event, 1)
	go func() {
		var evs []event
		defer func() { events <- evs }()
		for finals := 0; finals < len(items); {
			req, err := rcv.RecvRequest(ctx)
			if err != nil {
				t.Errorf("RecvRequest: %v", err)
				return
			}
			o := req.Offer
			if !req.Segment {
				evs = append(evs, event{id: o.SegmentID})
				if err := rcv.SendAccept(ctx, o); err != nil {
					t.Error(err)
					return
				}
				continue
			}
			var b bytes.Buffer
			if err := rcv.RecvPayload(ctx, o, func(r io.Reader) error { _, err := io.Copy(&b, r); return err }); err != nil {
				t.Errorf("RecvPayload: %v", err)
				return
			}
			evs = append(evs, event{o.SegmentID, req.Pushed, b.Bytes()})
			if offerFor(o.SegmentID, b.Bytes()).SHA256 != o.SHA256 {
				t.Errorf("%s: payload does not match its digest", o.SegmentID)
			}
			finals++
			if o.SegmentID == "refused" {
				err = rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackQuota})
			} else {
				err = rcv.SendAck(ctx, o.SegmentID)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	res := snd.DeliverWindow(ctx, items, 10*time.Second)
	evs := <-events
	pushed := map[string]bool{}
	offered := map[string]bool{}
	for _, e := range evs {
		if e.data == nil && !e.pushed {
			offered[e.id] = true
		}
		if e.pushed {
			pushed[e.id] = true
		}
	}
	for i, r := range res {
		id := items[i].Offer.SegmentID
		wantPush := items[i].Push && items[i].Offer.Size <= MaxPushSize
		if pushed[id] != wantPush || offered[id] == wantPush {
			t.Errorf("%s: pushed %v, offered %v; want pushed %v", id, pushed[id], offered[id], wantPush)
		}
		var ne *NackError
		switch {
		case id == "refused":
			if !errors.As(r.Err, &ne) || ne.Nack.Code != NackQuota || !r.Sent || !r.Replied {
				t.Errorf("%s: %+v, want NACK quota after its bytes", id, r)
			}
		case r.Err != nil || !r.Sent:
			t.Errorf("%s: %+v, want sent and acknowledged", id, r)
		}
	}
}

// TestPushSourceFails: a pushed item whose source cannot be read fails
// alone, before any byte is sent; the stream goes on with the others.
func TestPushSourceFails(t *testing.T) {
	ctx := context.Background()
	snd, rcv := v2Pair(t, 4)
	short := pushItem("short", []byte("four"))
	short.Offer.Size = 10 // the source ends early
	gone := pushItem("gone", nil)
	gone.Open = func() (io.ReadCloser, error) { return nil, errors.New("file vanished") }
	items := []Item{short, gone, pushItem("ok", []byte("fine"))}
	go func() {
		for {
			req, err := rcv.RecvRequest(ctx)
			if err != nil {
				return // the sender closed
			}
			if err := rcv.RecvPayload(ctx, req.Offer, func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }); err != nil {
				t.Errorf("RecvPayload: %v", err)
				return
			}
			if req.Offer.SegmentID != "ok" {
				t.Errorf("received %s, whose source failed", req.Offer.SegmentID)
			}
			if err := rcv.SendAck(ctx, req.Offer.SegmentID); err != nil {
				t.Error(err)
			}
		}
	}()
	res := snd.DeliverWindow(ctx, items, 10*time.Second)
	for i, r := range res[:2] {
		if !errors.Is(r.Err, ErrSource) || r.Sent {
			t.Errorf("%s: %+v, want ErrSource before sending", items[i].Offer.SegmentID, r)
		}
	}
	if res[2].Err != nil || !res[2].Sent {
		t.Errorf("ok: %+v, want acknowledged", res[2])
	}
	snd.Close()
}

// TestPushAcceptRefused: an ACCEPT for a pushed segment is the receiver
// breaking the protocol: no ACCEPT is owed for a PUSH.
func TestPushAcceptRefused(t *testing.T) {
	ctx := context.Background()
	snd, rcv := v2Pair(t, 4)
	go func() {
		req, err := rcv.RecvRequest(ctx)
		if err == nil {
			err = rcv.sendControl(ctx, "accept", TypeAccept, []byte(req.Offer.SegmentID), nil)
		}
		if err != nil {
			t.Error(err)
		}
	}()
	res := snd.DeliverWindow(ctx, []Item{pushItem("p", []byte("x"))}, 10*time.Second)
	if !errors.Is(res[0].Err, ErrAckMismatch) {
		t.Fatalf("err = %v, want ErrAckMismatch", res[0].Err)
	}
}

// TestReceiverChecksPush: what a PUSH promises is enforced, each breach a
// protocol violation that leaves the stream out of step: the size limit,
// its SEGMENT right behind it with the pushed length, and the window
// (which pushed and offered segments share).
func TestReceiverChecksPush(t *testing.T) {
	ctx := context.Background()
	small := offerFor("p", []byte("hello"))
	big := offerFor("big", bytes.Repeat([]byte{1}, MaxPushSize+1))
	push := func(o Offer) []byte {
		p, err := EncodeOffer(o)
		if err != nil {
			t.Fatal(err)
		}
		return AppendFrame(nil, TypePush, p)
	}
	seg := func(n int) []byte { return AppendFrame(nil, TypeSegment, make([]byte, n)) }
	offer := func(o Offer) []byte {
		p, err := EncodeOffer(o)
		if err != nil {
			t.Fatal(err)
		}
		return AppendFrame(nil, TypeOffer, p)
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name   string
		frames []byte
		reads  int
		want   error
		reason string
	}{
		{"above the push limit", cat(push(big), seg(MaxPushSize+1)), 1, ErrFrameTooLarge, "too_large"},
		{"another frame behind it", cat(push(small), offer(offerFor("o", nil))), 1, ErrUnexpectedFrame, "unexpected_frame"},
		{"a SEGMENT of another length", cat(push(small), seg(4)), 1, ErrSizeMismatch, "size_mismatch"},
		{"beyond the window", cat(offer(offerFor("a", nil)), offer(offerFor("b", nil)), push(small), seg(5)), 3, ErrWindow, "window"},
		{"undecodable", cat(AppendFrame(nil, TypePush, []byte(`{"segment_id":1}`)), seg(5)), 1, ErrBadMessage, "bad_message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snd, rcv := v2Pair(t, 2)
			if err := snd.send(ctx, "raw", func(w io.Writer) error { _, err := w.Write(tc.frames); return err }); err != nil {
				t.Fatal(err)
			}
			var err error
			for range tc.reads {
				if _, err = rcv.RecvRequest(ctx); err != nil {
					break
				}
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if reason, ok := ProtocolViolation(err); !ok || reason != tc.reason {
				t.Fatalf("%v: violation %q %v, want %q", err, reason, ok, tc.reason)
			}
			if _, err := rcv.RecvRequest(ctx); !errors.Is(err, ErrBroken) {
				t.Fatalf("next read: %v, want ErrBroken (out of step)", err)
			}
		})
	}
}

// TestPushOnVersion1: a version 1 receiver takes a PUSH for what it is
// there, a frame of an unexpected type.
func TestPushOnVersion1(t *testing.T) {
	ctx := context.Background()
	snd, rcv := tcpPair(t, Options{Version: Version1})
	p, err := EncodeOffer(offerFor("p", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	if err := snd.sendControl(ctx, "push", TypePush, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvOffer(ctx); !errors.Is(err, ErrUnexpectedFrame) {
		t.Fatalf("err = %v, want ErrUnexpectedFrame", err)
	}
}
