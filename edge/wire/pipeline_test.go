package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// v2Pair is a version 2 connection pair after both HELLOs; the receiver
// announces window.
func v2Pair(t *testing.T, window int) (snd, rcv *Conn) {
	t.Helper()
	snd, rcv = tcpPair(t, Options{Version: Version2, Window: window})
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

func item(id string, data []byte) Item {
	return Item{Offer: offerFor(id, data), Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}
}

// TestDeliverWindow: one connection carries a window of offers; the
// receiver declines one it holds before any byte moves (ACK), refuses one
// (NACK quota, no SEGMENT follows), NACKs a bad digest after the bytes,
// and acknowledges the rest in reverse order once all arrived: replies
// are matched by id, and the sender never has more than the window
// unanswered.
func TestDeliverWindow(t *testing.T) {
	ctx := context.Background()
	const window = 3
	snd, rcv := v2Pair(t, window)
	var items []Item
	for i := range 8 {
		items = append(items, item(fmt.Sprintf("s%d", i), bytes.Repeat([]byte{byte(i)}, 1000*i)))
	}
	bad := item("bad", []byte("real content"))
	bad.Offer.SHA256 = offerFor("x", []byte("other content")).SHA256
	items = append(items, bad)

	type got struct {
		offers   []string
		received map[string][]byte
	}
	done := make(chan got, 1)
	go func() {
		g := got{received: map[string][]byte{}}
		var toAck []string
		defer func() { done <- g }()
		finals := 0
		for finals < len(items) {
			req, err := rcv.RecvRequest(ctx)
			if err != nil {
				t.Errorf("RecvRequest: %v", err)
				return
			}
			o := req.Offer
			if !req.Segment {
				g.offers = append(g.offers, o.SegmentID)
				switch o.SegmentID {
				case "s1", "s2":
					finals++
				}
				switch o.SegmentID {
				case "s1":
					err = rcv.SendAck(ctx, o.SegmentID) // already held
				case "s2":
					err = rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackQuota})
				default:
					err = rcv.SendAccept(ctx, o)
				}
				if err != nil {
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
			if offerFor(o.SegmentID, b.Bytes()).SHA256 != o.SHA256 {
				if err := rcv.SendNack(ctx, Nack{SegmentID: o.SegmentID, Code: NackChecksum}); err != nil {
					t.Error(err)
					return
				}
				finals++
			} else {
				g.received[o.SegmentID] = b.Bytes()
				toAck = append(toAck, o.SegmentID)
			}
			// Hold ACKs until the window is used up, then answer newest
			// first.
			rcv.mu.Lock()
			full := len(rcv.open) == window || len(g.offers) == len(items) && len(rcv.accepted) == 0
			rcv.mu.Unlock()
			if full {
				for _, id := range slices.Backward(toAck) {
					if err := rcv.SendAck(ctx, id); err != nil {
						t.Error(err)
						return
					}
					finals++
				}
				toAck = nil
			}
		}
	}()
	res := snd.DeliverWindow(ctx, items, 10*time.Second)
	g := <-done
	if len(g.offers) != len(items) {
		t.Fatalf("receiver saw %d offers: %v", len(g.offers), g.offers)
	}
	for i, r := range res {
		id := items[i].Offer.SegmentID
		var ne *NackError
		switch id {
		case "s1":
			if r.Err != nil || r.Sent {
				t.Errorf("%s (held): %+v, want declined success", id, r)
			}
		case "s2":
			if !errors.As(r.Err, &ne) || ne.Nack.Code != NackQuota || r.Sent {
				t.Errorf("%s: %+v, want NACK quota before sending", id, r)
			}
		case "bad":
			if !errors.As(r.Err, &ne) || ne.Nack.Code != NackChecksum || !r.Sent {
				t.Errorf("%s: %+v, want NACK checksum after sending", id, r)
			}
		default:
			if r.Err != nil || !r.Sent {
				t.Errorf("%s: %+v, want sent and acknowledged", id, r)
			}
		}
	}
}

// TestDeliverWindowFailures: replies the sender must not believe, and a
// peer that stops answering. (An ACK for an accepted segment whose SEGMENT
// has not been sent is refused too, but from outside it races with the
// sender's writer, so it is not provoked here.)
func TestDeliverWindowFailures(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		reply func(rcv *Conn, o Offer) error
		want  error
	}{
		{"ack for another segment", func(rcv *Conn, o Offer) error {
			return rcv.sendControl(ctx, "ack", TypeAck, []byte("other"), nil)
		}, ErrAckMismatch},
		{"accept twice", func(rcv *Conn, o Offer) error {
			if err := rcv.SendAccept(ctx, o); err != nil {
				return err
			}
			return rcv.sendControl(ctx, "accept", TypeAccept, []byte(o.SegmentID), nil)
		}, ErrAckMismatch},
		{"no reply", func(rcv *Conn, o Offer) error { return nil }, os.ErrDeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snd, rcv := v2Pair(t, 4)
			go func() {
				req, err := rcv.RecvRequest(ctx)
				if err == nil {
					err = tc.reply(rcv, req.Offer)
				}
				if err != nil {
					t.Error(err)
				}
			}()
			res := snd.DeliverWindow(ctx, []Item{item("s1", []byte("x"))}, 200*time.Millisecond)
			if !errors.Is(res[0].Err, tc.want) {
				t.Fatalf("err = %v, want %v", res[0].Err, tc.want)
			}
		})
	}
}

// TestReceiverEnforcesWindow: an OFFER beyond the announced window, or a
// second OFFER for a segment in flight, is a protocol violation.
func TestReceiverEnforcesWindow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		offers []string
		want   error
	}{
		{"beyond the window", []string{"a", "b", "c"}, ErrWindow},
		{"duplicate in flight", []string{"a", "a"}, ErrUnexpectedFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snd, rcv := v2Pair(t, 2)
			for _, id := range tc.offers {
				if err := snd.SendOffer(ctx, offerFor(id, nil)); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			for range tc.offers {
				if _, err = rcv.RecvRequest(ctx); err != nil {
					break
				}
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if _, ok := ProtocolViolation(err); !ok {
				t.Fatalf("%v is not a protocol violation", err)
			}
		})
	}
}

// TestQuery: a QUERY is answered by HOLDS; Query keeps only the entries
// named with exactly the queried size and digest, refuses a name that was
// not queried, and a QUERY while an offer is unanswered is a violation.
func TestQuery(t *testing.T) {
	ctx := context.Background()
	snd, rcv := v2Pair(t, 4)
	a, b, c := offerFor("a", []byte("A")), offerFor("b", []byte("B")), offerFor("c", []byte("C"))
	otherB := b
	otherB.SHA256 = offerFor("x", []byte("other")).SHA256
	errs := goAsync(func() error {
		req, err := rcv.RecvRequest(ctx)
		if err != nil {
			return err
		}
		if len(req.Query) != 3 {
			return fmt.Errorf("query %+v", req)
		}
		return rcv.SendHolds(ctx, []Offer{a, otherB})
	})
	held, mismatched, err := snd.Query(ctx, []Offer{a, b, c})
	if err != nil || len(held) != 1 || held[0] != a || mismatched != 1 {
		t.Fatalf("Query = %+v, %d mismatched, %v; want only a, b's other digest not counted", held, mismatched, err)
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
	if _, _, err := snd.Query(ctx, []Offer{a}); !errors.Is(err, ErrAckMismatch) {
		t.Fatalf("HOLDS naming an unqueried segment: %v, want ErrAckMismatch", err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}

	if err := snd.SendOffer(ctx, c); err != nil {
		t.Fatal(err)
	}
	p, _ := EncodeSegments([]Offer{a})
	if err := snd.sendControl(ctx, "query", TypeQuery, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvRequest(ctx); !errors.Is(err, ErrUnexpectedFrame) {
		t.Fatalf("QUERY with an offer unanswered: %v, want ErrUnexpectedFrame", err)
	}
}

// TestQueryHold: a receiver with Options.Hold asks it for QueryMemory of
// the QUERY's length before reading the payload, and gives the memory back
// once its HOLDS went out, or when the connection closes unanswered; a
// refused Hold fails the read.
func TestQueryHold(t *testing.T) {
	ctx := context.Background()
	snd, rcv := v2Pair(t, 4)
	list := []Offer{offerFor("a", []byte("A")), offerFor("b", []byte("B"))}
	p, _ := EncodeSegments(list)
	var mu sync.Mutex
	var asked []int64
	held := 0
	refuse := errors.New("no memory")
	rcv.opt.Hold = func(_ context.Context, n int64) (func(), error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, n)
		if len(asked) == 3 {
			return nil, refuse
		}
		held++
		return func() { mu.Lock(); held--; mu.Unlock() }, nil
	}
	outstanding := func() int { mu.Lock(); defer mu.Unlock(); return held }

	errs := goAsync(func() error {
		req, err := rcv.RecvRequest(ctx)
		if err != nil {
			return err
		}
		if n := outstanding(); n != 1 || len(req.Query) != 2 {
			return fmt.Errorf("%d held while answering %+v", n, req)
		}
		return rcv.SendHolds(ctx, nil)
	})
	if _, _, err := snd.Query(ctx, list); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if n := outstanding(); n != 0 || len(asked) != 1 || asked[0] != QueryMemory(len(p)) {
		t.Fatalf("after HOLDS: %d held, asked %v, want [%d]", n, asked, QueryMemory(len(p)))
	}

	// Unanswered, then closed: given back.
	if err := snd.sendControl(ctx, "query", TypeQuery, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if n := outstanding(); n != 1 {
		t.Fatalf("%d held while a QUERY is unanswered", n)
	}
	if err := snd.sendControl(ctx, "query", TypeQuery, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.RecvRequest(ctx); !errors.Is(err, refuse) {
		t.Fatalf("QUERY with Hold refusing: %v", err)
	}
	rcv.Close()
	if n := outstanding(); n != 0 {
		t.Fatalf("%d held after Close", n)
	}
}

func TestDecodeSegments(t *testing.T) {
	o := `{"segment_id":"s1","size":0,"sha256":"` + digest + `"}`
	for _, tc := range []struct {
		name, in string
		n        int
		err      string
	}{
		{"empty list", `{"segments":[]}`, 0, ""},
		{"one", `{"segments":[` + o + `]}`, 1, ""},
		{"duplicate id", `{"segments":[` + o + `,` + o + `]}`, 0, "listed twice"},
		{"not a list", `{"segments":{}}`, 0, `key "segments"`},
		{"null", `{"segments":null}`, 0, "is null"},
		{"bad entry", `{"segments":[{"segment_id":"s1"}]}`, 0, "missing key"},
		{"extra key", `{"segments":[],"more":1}`, 0, "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeSegments([]byte(tc.in))
			if tc.err == "" {
				if err != nil || len(got) != tc.n {
					t.Fatalf("DecodeSegments = %+v, %v", got, err)
				}
				return
			}
			if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want ErrBadMessage containing %q", err, tc.err)
			}
		})
	}
}

// TestDeliverWindowReusable: a stream that ends cleanly leaves the
// connection in step, so the next one (and a QUERY) runs on it.
func TestDeliverWindowReusable(t *testing.T) {
	ctx := context.Background()
	snd, rcv := v2Pair(t, 2)
	go func() {
		for {
			req, err := rcv.RecvRequest(ctx)
			if err != nil {
				return
			}
			switch {
			case req.Query != nil:
				err = rcv.SendHolds(ctx, nil)
			case !req.Segment:
				err = rcv.SendAccept(ctx, req.Offer)
			default:
				err = rcv.RecvPayload(ctx, req.Offer, func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err })
				if err == nil {
					err = rcv.SendAck(ctx, req.Offer.SegmentID)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for round := range 3 {
		res := snd.DeliverWindow(ctx, []Item{item(fmt.Sprintf("r%d-a", round), []byte("a")), item(fmt.Sprintf("r%d-b", round), []byte("b"))}, 10*time.Second)
		for _, r := range res {
			if r.Err != nil || !r.Sent {
				t.Fatalf("round %d: %+v", round, r)
			}
		}
		if _, _, err := snd.Query(ctx, []Offer{offerFor("q", nil)}); err != nil {
			t.Fatalf("round %d: query after a stream: %v", round, err)
		}
	}
}
